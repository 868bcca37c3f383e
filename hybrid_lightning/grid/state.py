"""Where each cell of a grid stands, from its run directory and its job records.

``<root>/.grid/jobs.json`` holds, per cell, the jobs submitted for it (newest last): SLURM job
ids, or local process ids. A cell's state combines the newest job (alive or not, per ``squeue``
or the process table), the run's ``status.json`` and, for a job that ended early, the reason in
its log. States:

    not submitted   no job and no run directory
    pending         queued, never started
    running         a job is training it (other SLURM states of a live job show as they are, e.g. completing)
    requeued        queued again after a timeout or preemption; it will resume
    done            reached train.max_steps
    failed          the job ended early (the reason is shown)
    cancelled       cancelled (``grid cancel`` or ``scancel``)
    incomplete      a partial run and no job: stopped (e.g. a local submit interrupted), or max_steps raised
"""

from __future__ import annotations

import datetime
import getpass
import json
import os
import re
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock

from hybrid_lightning.grid.spec import Cell, Grid
from hybrid_lightning.rundir import read_events, read_status, write_atomic

JOBS_FILE = "jobs.json"
# slurmstepd's last words in a job's log when it is killed: "*** JOB 12 ON node CANCELLED AT <time> [DUE TO ...] ***"
_KILLED = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))? \*\*\*")
_SLURM_LIVE_STATES = {
    "RUNNING": "running", "CONFIGURING": "running", "REQUEUED": "requeued", "REQUEUE_HOLD": "requeued",
    "REQUEUE_FED": "requeued",
}


@dataclass
class CellState:
    """One row of ``grid status``; ``live`` when a job or process is on it (submit skips it)."""

    name: str
    state: str
    live: bool
    step: int | None
    max_steps: int
    loss: float | None
    longctx: float | None
    job_id: str | None
    log: str | None
    reason: str | None
    run_dir: str

    def as_dict(self) -> dict:
        return asdict(self)


def lock(grid: Grid) -> FileLock:
    """The grid's submission lock: one submitter at a time decides what to submit."""
    grid.state_dir.mkdir(parents=True, exist_ok=True)
    return FileLock(str(grid.state_dir / "submit.lock"))


def read_jobs(grid: Grid) -> dict[str, list[dict]]:
    path = grid.state_dir / JOBS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_jobs(grid: Grid, jobs: dict[str, list[dict]]) -> None:
    grid.state_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(grid.state_dir / JOBS_FILE, json.dumps(jobs, indent=1))


def add_records(grid: Grid, records: dict[str, dict]) -> None:
    """Appends one job record per cell (call under ``lock(grid)``)."""
    jobs = read_jobs(grid)
    for name, record in records.items():
        jobs.setdefault(name, []).append(record)
    write_jobs(grid, jobs)


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def check_slurm() -> None:
    """A ``ValueError`` when SLURM's commands are missing or its controller does not answer."""
    for tool in ("sbatch", "squeue", "scancel"):
        if shutil.which(tool) is None:
            raise ValueError(f"SLURM is not available here: '{tool}' is not on PATH (use --executor local to run without SLURM)")
    squeue_jobs()


def squeue_jobs() -> dict[str, tuple[str, int]]:
    """The user's SLURM jobs as ``{job id: (state, restart count)}``; array tasks as ``<array>_<task>``."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-r", "-u", getpass.getuser(), "-O", "JobArrayID:|,State:|,RestartCnt:|"],
            capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"SLURM is unreachable: squeue failed ({e})") from None
    if out.returncode:
        raise ValueError(f"SLURM is unreachable: squeue failed: {out.stderr.strip() or out.returncode}")
    jobs = {}
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 3:
            jobs[parts[0].strip()] = (parts[1].strip(), int(parts[2]) if parts[2].strip().isdigit() else 0)
    return jobs


def process_alive(pid: int | None, start: str | None) -> bool:
    """Whether process ``pid`` exists, is not a zombie, and started at ``start`` (so a reused pid is not it)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = process_start(pid)
    return stat is None or start is None or stat == start


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat``), None for a zombie or without /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _last_scalars(run_dir: Path, tags: tuple[str, ...]) -> dict[str, tuple[int, float]]:
    """The newest (step, value) of each tag in the run's TensorBoard events (steps purged on resume excluded)."""
    acc = read_events(run_dir, scalars=1)
    if acc is None:
        return {}
    present = set(acc.Tags().get("scalars", []))
    series = {t: acc.Scalars(t) for t in tags if t in present}
    return {t: (events[-1].step, events[-1].value) for t, events in series.items() if events}  # a resume may purge all


def _log_ending(log: str | None) -> tuple[str, str] | None:
    """(time, cause) when slurmstepd killed the job: cause '' for scancel, else e.g. 'TIME LIMIT'."""
    if not log or not Path(log).is_file():
        return None
    with open(log, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 20000))
        tail = f.read().decode(errors="replace")
    # A requeue also kills the job step, but the job goes on: not an ending.
    found = [(when, cause) for when, cause in _KILLED.findall(tail) if cause != "JOB REQUEUE"]
    return found[-1] if found else None


def _result_error(record: dict) -> str | None:
    """The last line of the traceback submitit pickled for a job that raised."""
    result = record.get("result")
    if not result or not Path(result).is_file():
        return None
    import pickle

    try:
        with open(result, "rb") as f:
            kind, payload = pickle.load(f)
    except Exception:  # a result being written or unreadable says nothing
        return None
    if kind != "error":
        return None
    lines = [line for line in str(payload).strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def cell_states(grid: Grid, cells: list[Cell] | None = None, slurm_jobs: dict | None = None) -> list[CellState]:
    """The state of each cell (all by default). ``squeue`` is asked once, only if a SLURM job is on record.

    Args:
        grid: the expanded grid.
        cells: the cells to report; default all.
        slurm_jobs: ``squeue_jobs()`` when the caller already has it.
    """
    cells = grid.cells if cells is None else cells
    jobs = read_jobs(grid)
    if slurm_jobs is None and any(r[-1].get("executor") == "slurm" for r in jobs.values() if r):
        slurm_jobs = squeue_jobs()
    return [_cell_state(c, (jobs.get(c.name) or [None])[-1], slurm_jobs or {}) for c in cells]


def _cell_state(cell: Cell, record: dict | None, slurm_jobs: dict) -> CellState:
    status = read_status(cell.run_dir) or {}
    max_steps = cell.config.train.max_steps
    scalars = _last_scalars(cell.run_dir, ("train/loss", "longctx/score"))
    step = status.get("step")
    if "train/loss" in scalars:
        step = max(step or 0, scalars["train/loss"][0] + 1)  # the loss of step s is logged at index s
    row = CellState(
        cell.name, "not submitted", False, step, max_steps, scalars.get("train/loss", (0, None))[1],
        scalars.get("longctx/score", (0, None))[1], None, None, None, str(cell.run_dir),
    )
    if record is not None and (record.get("executor") == "slurm" or record.get("pid")):
        row.job_id = record.get("job_id") or str(record["pid"])
        row.log = record.get("log")
    if status.get("state") == "done" and status.get("step", 0) >= max_steps:
        row.state, row.step = "done", status["step"]
        return row
    live = _live_state(record, slurm_jobs)
    if live is not None:
        row.state, row.live = live, True
        return row
    if record is not None and record.get("executor") == "local" and not record.get("pid") and not record.get("cancelled"):
        record = None  # queued by a local submit that ended before starting it
    if status.get("state") == "done":  # done at fewer steps than the grid now asks
        row.state, row.reason = "incomplete", f"trained {status.get('step')} steps; train.max_steps is now {max_steps}"
        return row
    if record is None:
        if status:
            row.state = "failed" if status.get("state") == "failed" else "incomplete"
            row.reason = status.get("error")
        return row
    ending = _log_ending(record.get("log"))
    if record.get("cancelled") or (ending is not None and ending[1] == ""):
        row.state, row.reason = "cancelled", f"cancelled at {ending[0]}" if ending else "cancelled"
    elif status.get("state") == "failed":
        row.state, row.reason = "failed", status.get("error")
    elif ending is not None:
        row.state, row.reason = "failed", f"killed: {ending[1].lower()} (at step {step or 0}/{max_steps})"
    elif status.get("state") == "interrupted":  # e.g. the local executor stopped by Ctrl-C
        row.state, row.reason = "incomplete", f"stopped at step {status.get('step')}" + (f" ({status['error']})" if status.get("error") else "")
    else:
        exit_code = record.get("exit")
        row.state = "failed"
        row.reason = _result_error(record) or (
            f"exit code {exit_code}; see the log" if exit_code not in (None, 0) else f"the job ended at step {step or 0}/{max_steps}; see the log"
        )
    return row


def _live_state(record: dict | None, slurm_jobs: dict) -> str | None:
    """pending / running / requeued (or another SLURM state) while the record's job is alive, else
    None. A cancelled job stays live until it is gone: its process may still write."""
    if record is None:
        return None
    if record.get("executor") == "slurm":
        found = slurm_jobs.get(record.get("job_id"))
        if found is None:
            return None
        state, restarts = found
        if state == "PENDING":
            return "requeued" if restarts else "pending"
        return _SLURM_LIVE_STATES.get(state, state.lower())
    if record.get("host") != socket.gethostname():
        return None  # another machine's processes cannot be checked from here
    if record.get("pid"):
        return "running" if process_alive(record["pid"], record.get("pid_start")) else None
    if record.get("cancelled"):
        return None
    return "pending" if process_alive(record.get("submitter"), record.get("submitter_start")) else None
