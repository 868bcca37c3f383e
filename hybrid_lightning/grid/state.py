"""Where each cell of a grid stands, from its run directory and its job records.

``<root>/.grid/jobs.json`` holds, per cell, the jobs submitted for it (newest last), each record
naming the executor that wrote it (``grid/executor.py``). A cell's state combines the newest
job (alive or not, as its executor tells), the run's ``status.json`` and, for a job that ended
early, what its executor knows of the ending. States:

    not submitted   no job and no run directory
    pending         queued, never started
    running         a job is training it (other live states an executor reports show as they are, e.g. completing)
    requeued        queued again after a timeout or preemption; it will resume
    done            reached train.max_steps
    failed          the job ended early (the reason is shown)
    cancelled       cancelled (``grid cancel``, or the executor's own, e.g. ``scancel``)
    incomplete      a partial run and no job: stopped (e.g. a local submit interrupted), or max_steps raised
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock

from hybrid_lightning.fileio import write_atomic
from hybrid_lightning.grid.executor import Executor, executor_class
from hybrid_lightning.grid.spec import Cell, Grid
from hybrid_lightning.records import Tag
from hybrid_lightning.rundir.checkpoints import resume_step
from hybrid_lightning.rundir.events import read_events
from hybrid_lightning.rundir.files import read_plan
from hybrid_lightning.rundir.status import read_status
from hybrid_lightning.runplan import plan_from_dict

JOBS_FILE = "jobs.json"
CELLS_DIR = "cells"  # under the grid's state folder: each submitted cell's config (local) and plan
PLAN_SUFFIX = ".plan.json"


@dataclass
class CellState:
    """One row of ``grid status``; ``live`` when a job or process is on it (submit skips it)."""

    name: str
    state: str
    live: bool
    step: int | None
    # None: a budget in train.tokens_per_param of a cell not planned and never trained (planned_steps)
    max_steps: int | None
    loss: float | None
    longctx: float | None  # the last val_longctx/score (probe lengths up to train.seq_len)
    longctx_beyond: float | None  # the last val_longctx/score_beyond (longer probe lengths)
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


def cell_plan_path(grid: Grid, cell: Cell) -> Path:
    """Where the plan made when ``cell`` was submitted is recorded: ``.grid/cells/<cell>.plan.json``."""
    return grid.state_dir / CELLS_DIR / f"{cell.name}{PLAN_SUFFIX}"


def record_plan(grid: Grid, cell: Cell) -> Path | None:
    """Records the cell's plan (a planned grid's) for its job to check (``train(planned=...)``); a cell read
    without a plan drops the one an earlier submission recorded. Returns the file, None without a plan."""
    path = cell_plan_path(grid, cell)
    if cell.plan is None:
        path.unlink(missing_ok=True)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(cell.plan.as_dict(), indent=1))
    return path


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def _last_scalars(run_dir: Path, tags: tuple[str, ...]) -> dict[str, tuple[int, float]]:
    """The newest (step, value) of each tag in the run's TensorBoard events (steps purged on resume excluded)."""
    acc = read_events(run_dir, scalars=1)
    if acc is None:
        return {}
    present = set(acc.Tags().get("scalars", []))
    series = {t: acc.Scalars(t) for t in tags if t in present}
    return {t: (events[-1].step, events[-1].value) for t, events in series.items() if events}  # a resume may purge all


def planned_steps(grid: Grid, cell: Cell) -> int | None:
    """The cell's ``train.max_steps``, from its plan: the grid's (a resolved grid), else the config's where it
    states them, else (a budget in ``train.tokens_per_param`` of a grid read without plans, ``grid status``:
    counting parameters would load torch) the plan recorded when it was submitted, else its run's; None before
    either exists."""
    if cell.plan is not None:
        return cell.plan.budget.max_steps
    if cell.config.train.tokens_per_param is None:
        return cell.config.train.max_steps
    recorded = cell_plan_path(grid, cell)
    try:
        if recorded.is_file():
            return plan_from_dict(json.loads(recorded.read_text()), str(recorded)).budget.max_steps
        plan = read_plan(cell.run_dir)
    except ValueError:  # neither submitted nor trained yet
        return None
    return plan.budget.max_steps


def cell_states(grid: Grid, cells: list[Cell] | None = None) -> list[CellState]:
    """The state of each cell (all by default). Each executor on record is asked once about all
    of its jobs (e.g. one ``squeue``).

    Args:
        grid: the expanded grid.
        cells: the cells to report; default all.
    """
    cells = grid.cells if cells is None else cells
    jobs = read_jobs(grid)
    records = {c.name: jobs[c.name][-1] for c in cells if jobs.get(c.name)}
    executors = {name: executor_class(name)() for name in {r["executor"] for r in records.values()}}
    live = {}
    for name, executor in executors.items():
        mine = [cell for cell, r in records.items() if r["executor"] == name]
        live.update(zip(mine, executor.live_states([records[cell] for cell in mine])))
    rows = []
    for cell in cells:
        record = records.get(cell.name)
        rows.append(_cell_state(grid, cell, record, record and executors[record["executor"]], live.get(cell.name)))
    return rows


def _step_offset(run_dir: Path) -> int:
    """``RunPlan.step_offset`` of the run's recorded plan; 0 (this version's numbering) before it wrote one."""
    try:
        return read_plan(run_dir).step_offset
    except ValueError:
        return 0


def _cell_state(grid: Grid, cell: Cell, record: dict | None, executor: Executor | None, live: str | None) -> CellState:
    """``record`` is the cell's newest job record, ``executor`` the one that wrote it, ``live`` its live state."""
    status = read_status(cell.run_dir) or {}
    max_steps = planned_steps(grid, cell)
    scalars = _last_scalars(cell.run_dir, (Tag.LOSS, Tag.SCORE, Tag.SCORE_BEYOND))
    step = status.get("step")
    if Tag.LOSS in scalars:  # the steps completed, whichever way the run numbered them (RunPlan.step_offset)
        step = max(step or 0, scalars[Tag.LOSS][0] + _step_offset(cell.run_dir))
    row = CellState(
        cell.name, "not submitted", False, step, max_steps, scalars.get(Tag.LOSS, (0, None))[1],
        scalars.get(Tag.SCORE, (0, None))[1], scalars.get(Tag.SCORE_BEYOND, (0, None))[1], None, None, None,
        str(cell.run_dir),
    )
    if record is not None and (job_id := executor.job_id(record)) is not None:
        row.job_id, row.log = job_id, record.get("log")
    if status.get("state") == "done" and status.get("step", 0) >= (max_steps or status.get("max_steps") or 0):
        row.state, row.step = "done", status["step"]
        return row
    if live is not None:
        row.state, row.live = live, True
        return row
    if record is not None and executor.abandoned(record):
        record = None
    if status and status.get("state") != "done":  # stopped: where it resumes, not the step logged last (a rank
        row.step = step = resume_step(cell.run_dir)  # may have died after it)
    if status.get("state") == "done":  # done at fewer steps than the grid now asks
        row.state, row.reason = "incomplete", f"trained {status.get('step')} steps; train.max_steps is now {max_steps}"
        return row
    if record is None:
        if status:
            row.state = "failed" if status.get("state") == "failed" else "incomplete"
            row.reason = status.get("error")
        return row
    ending = executor.ending(record)
    if record.get("cancelled") or (ending is not None and ending[1] == ""):
        row.state, row.reason = "cancelled", f"cancelled at {ending[0]}" if ending else "cancelled"
    elif status.get("state") == "failed":  # on another rank's failure, rank 0's error is a consequence: the rank first
        row.state, row.reason = ("failed",
                                 "; then ".join(filter(None, (executor.lost_task(record), status.get("error"))))
                                 or None)
    elif ending is not None:
        row.state, row.reason = "failed", f"killed: {ending[1].lower()} (at step {step or 0}/{max_steps})"
    elif status.get("state") == "interrupted":  # e.g. the local executor stopped by Ctrl-C
        why = f" ({status['error']})" if status.get("error") else ""
        row.state, row.reason = "incomplete", f"stopped at step {step}{why}"
    else:
        row.state = "failed"
        row.reason = executor.failure(record) or f"the job ended at step {step or 0}/{max_steps}; see the log"
    return row
