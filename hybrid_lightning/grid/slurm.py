"""The ``slurm`` executor: cells submitted with submitit as job arrays; their state from ``squeue``,
slurmstepd's last words in the log and submitit's result files.

A profile (``slurm/<cluster>.yaml``) is a mapping of submitit ``AutoExecutor`` parameters:
``timeout_min``, ``cpus_per_task``, ``mem_gb``, ``slurm_partition``, ``slurm_array_parallelism``,
``slurm_setup``, ``slurm_additional_parameters``, ... plus the executor's own
``slurm_max_num_timeout``; ``--set PARAM=VALUE`` overrides one. The world of a cell follows from
its config (``grid/geometry.py``): a profile may repeat it but not contradict it, and the partition
must hold it, both checked before anything is submitted. srun ends a job's step when one of its
tasks fails (``--kill-on-bad-exit``): the others would wait for it in their next collective.
"""

from __future__ import annotations

import getpass
import os
import pickle
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import submitit
import yaml
from submitit.core.utils import FailedJobError

from hybrid_lightning.config import apply_overrides, config_to_dict, suggest
from hybrid_lightning.grid.capacity import GPU_KEY
from hybrid_lightning.grid.executor import Executor, register
from hybrid_lightning.grid.geometry import (
    GPU_KEYS,
    WORLD_KEYS,
    World,
    cell_resources,
    check_partition,
    check_profile_world,
    partition_nodes,
)
from hybrid_lightning.grid.job import CellJob
from hybrid_lightning.grid.spec import Cell, Grid
from hybrid_lightning.grid.state import add_records, now

# Arguments of submitit's SlurmExecutor constructor rather than of update_parameters.
_CONSTRUCTOR_KEYS = {"slurm_max_num_timeout", "slurm_max_pickle_size_gb", "slurm_python"}
# srun ends the step when a task exits with an error or a signal, instead of leaving the others waiting for it
_KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"
# slurmstepd's last words in a job's log when it is killed: "*** JOB 12 ON node CANCELLED AT <time> [DUE TO ...] ***"
_KILLED = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))? \*\*\*")
# srun's word on tasks that ended badly: "srun: error: n2: task 1: Killed",
# "srun: error: n1: tasks 0-1: Exited with exit code 1"
_TASK_ENDED = re.compile(r"^srun: error: (\S+): task(s?) ([\d,\-]+): (.+)$", re.M)
# submitit's line at every start of a task: what follows the last one in the log is the job's current run
_STARTED = "Starting with JobEnvironment"
# squeue's states of a live job that read as grid states; the others show lower-cased (e.g. completing)
_LIVE_STATES = {
    "RUNNING": "running", "CONFIGURING": "running", "REQUEUED": "requeued", "REQUEUE_HOLD": "requeued",
    "REQUEUE_FED": "requeued",
}


@register
class SlurmExecutor(Executor):
    """Job arrays on a SLURM cluster, one per distinct resource request (``submit_slurm``); a
    record holds the job id (``<array>_<task>``), the log of task 0 and submitit's result file."""

    name = "slurm"
    help = "SLURM job arrays through submitit, with --profile"
    takes_profile = True

    def check(self) -> None:
        self.load()
        check_slurm()

    def load(self) -> None:
        """Reads the profile and ``--set`` (no SLURM needed): ``settings``, and ``origin`` (key -> where it was set)."""
        self.settings, self.origin = read_profile(self.profile, self.overrides)

    def check_cells(self, cells: list[Cell]) -> str | None:
        """Refuses a profile that contradicts a cell's world, or a partition that cannot hold it (where
        SLURM answers; otherwise says so). Call ``load`` or ``check`` first."""
        check_profile_world(cells, self.settings, self.origin)
        found = partition_nodes(self.settings.get("slurm_partition"))
        if found is None:
            return "the cells were not checked against the partition: SLURM does not answer here"
        check_partition(cells, self.settings, *found)
        return None

    def check_plan(self, cells: list[Cell]) -> str | None:
        """As SLURM would run the cells: the profile's world and, where SLURM answers, the partition."""
        self.load()
        return self.check_cells(cells)

    def submit(self, grid: Grid, cells: list[Cell], say: Callable[[str], None]) -> None:
        submit_slurm(grid, cells, self.settings, say)

    def cancel(self, records: list[dict]) -> None:
        out = subprocess.run(["scancel", *(r["job_id"] for r in records)], capture_output=True, text=True, timeout=60)
        if out.returncode:
            raise ValueError(f"scancel failed: {out.stderr.strip()}")

    def live_states(self, records: list[dict]) -> list[str | None]:
        queue = squeue_jobs()
        return [_grid_state(*queue[r["job_id"]]) if r["job_id"] in queue else None for r in records]

    def job_id(self, record: dict) -> str | None:
        return record["job_id"]

    def ending(self, record: dict) -> tuple[str, str] | None:
        """(time, cause) from slurmstepd's last words in the log: cause '' for scancel, else e.g. 'TIME LIMIT'.
        A step that srun ended because a task failed first is not ended from outside (``lost_task``)."""
        events = _log_events(record)
        if events and events[0][0] == "task":
            return None
        kills = [found for kind, found in events if kind == "killed"]
        return kills[-1] if kills else None

    def lost_task(self, record: dict) -> str | None:
        """The task that failed before anything else ended the job's current run, from srun's error
        line, with the task's own error where it raised one; not rank 0 exiting with an error code:
        the run records its error itself."""
        events = _log_events(record)
        if not events or events[0][0] != "task":
            return None
        node, plural, tasks, what = events[0][1]
        first = re.split(r"[,-]", tasks)[0]
        if first == "0" and what.startswith("Exited with exit code"):
            return None
        error = _task_error(record, first) if what.startswith("Exited with exit code") else None
        return f"rank{plural} {tasks} on {node}: {error or what}"  # one task per rank: srun's task ids are the ranks

    def failure(self, record: dict) -> str | None:
        """The task that failed first (``lost_task``), else the error rank 0 raised."""
        return self.lost_task(record) or _task_error(record, "0")


def _task_error(record: dict, task: str) -> str | None:
    """The last line of the traceback submitit pickled for one task of the record's job (the record
    names task 0's result file, ``<job>_0_result.pkl``); None when it raised none."""
    result = record.get("result")
    if not result:
        return None
    path = Path(result.removesuffix("_0_result.pkl") + f"_{task}_result.pkl")  # submitit: <job>_<task>_result.pkl
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as f:
            kind, payload = pickle.load(f)
    except Exception:  # a result being written or unreadable says nothing
        return None
    if kind != "error":
        return None
    lines = [line for line in str(payload).strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def _log_events(record: dict) -> list[tuple[str, tuple]]:
    """In log order, the ends of the job's current run (after its last start) that its log records:
    ``("killed", (time, cause))`` from slurmstepd, requeues left out (the job goes on), and
    ``("task", (node, plural, tasks, what))`` from srun."""
    log = record.get("log")
    if not log or not Path(log).is_file():
        return []
    with open(log, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 20000))
        run = f.read().decode(errors="replace").rpartition(_STARTED)[2]
    kills = [(m.start(), "killed", m.groups(default="")) for m in _KILLED.finditer(run) if m.group(2) != "JOB REQUEUE"]
    tasks = [(m.start(), "task", m.groups()) for m in _TASK_ENDED.finditer(run)]
    return [(kind, found) for _, kind, found in sorted(kills + tasks)]


def _grid_state(state: str, restarts: int) -> str:
    """A live job's ``squeue`` state and restart count as a grid state."""
    if state == "PENDING":
        return "requeued" if restarts else "pending"
    return _LIVE_STATES.get(state, state.lower())


def check_slurm() -> None:
    """A ``ValueError`` when SLURM's commands are missing or its controller does not answer."""
    for tool in ("sbatch", "squeue", "scancel"):
        if shutil.which(tool) is None:
            raise ValueError(f"SLURM is not available here: '{tool}' is not on PATH (use --executor local to run "
                             "without SLURM)")
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


def _valid_keys() -> set[str]:
    slurm = {f"slurm_{k}" for k in submitit.SlurmExecutor._valid_parameters()}
    return set(submitit.AutoExecutor._valid_parameters()) | slurm | _CONSTRUCTOR_KEYS


def load_profile(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Reads and checks a profile with ``--set`` ``overrides`` applied; a ``ValueError`` names a
    missing file or a bad key. Keys that state the world (``nodes``, ``tasks_per_node``, ...) are
    checked against each cell later (``geometry.check_profile_world``)."""
    return read_profile(path, overrides)[0]


def read_profile(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> tuple[dict, dict[str, str]]:
    """``load_profile``, and where each key was set (``profile PATH`` or ``--set``), for messages."""
    if path is None and not overrides:
        raise ValueError("--executor slurm needs --profile: a YAML file of submitit AutoExecutor parameters (see "
                         "slurm/example.yaml)")
    profile: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"profile not found: {path}")
        try:
            profile = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"profile {path}: not valid YAML: {e}") from None
        if not isinstance(profile, dict):
            raise ValueError(f"profile {path}: must be a mapping of submitit AutoExecutor parameters")
    profile = {k: v for k, v in profile.items() if k != GPU_KEY}  # the GPU grid plan assumes (grid/capacity.py)
    origin = dict.fromkeys(profile, f"profile {path}")
    origin.update({item.partition("=")[0].strip().split(".")[0]: "--set" for item in overrides})
    profile = apply_overrides(profile, overrides)
    valid = _valid_keys()
    for key in profile:
        if key in GPU_KEYS:
            raise ValueError(f"{origin[key]}: '{key}' follows from each cell (train.devices GPUs per node); remove it")
        if key not in valid:
            hint = suggest(key, sorted(valid), cutoff=0.6)
            raise ValueError(f"{origin[key]}: unknown submitit parameter '{key}'{hint}")
    for key in ("gpus_per_node", *WORLD_KEYS):
        value, least = profile.get(key, 1), 0 if "gpus" in key else 1
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{origin[key]}: {key} must be a whole number >= {least}, got {value!r}")
    # submitit checks the names and types; its local flavour does so without SLURM on this machine.
    folder = Path(path).parent if path is not None else Path.cwd()
    _executor(folder, profile, (1, 1, profile.get("gpus_per_node", 0)), "check", f"profile {path or '(--set)'}",
              "local")
    return profile, origin


def _executor(
    folder: Path, profile: dict, resources: World, name: str, where: str = "profile", cluster: str = "slurm"
) -> submitit.AutoExecutor:
    nodes, tasks, gpus = resources
    params = {"name": name, "stderr_to_stdout": True}  # one log per task: the researcher reads one file
    params.update({k: v for k, v in profile.items()
                   if k not in _CONSTRUCTOR_KEYS | WORLD_KEYS.keys() | {"gpus_per_node"}})
    params.update(nodes=nodes, tasks_per_node=tasks, gpus_per_node=gpus or None)
    srun_args = list(profile.get("slurm_srun_args") or [])
    if not any(a.startswith(("--kill-on-bad-exit", "-K")) for a in srun_args):
        params["slurm_srun_args"] = [*srun_args, _KILL_ON_BAD_EXIT]
    try:
        constructor = {k: profile[k] for k in _CONSTRUCTOR_KEYS & set(profile)}
        executor = submitit.AutoExecutor(folder=folder, cluster=cluster, **constructor)
        executor.update_parameters(**params)
    except (NameError, AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    except RuntimeError as e:  # no srun on this machine
        raise ValueError(f"SLURM is not available here: {e}") from None
    return executor


def submit_slurm(grid: Grid, cells: list[Cell], profile: dict, say: Callable[[str], None]) -> None:
    """Submits ``cells`` as one job array per distinct resource request and records each job
    (call under ``lock(grid)``); each array is recorded as soon as sbatch accepts it.

    Args:
        grid: the grid (its ``.grid/slurm`` folder gets submitit's pickles and the logs).
        cells: the cells to submit.
        profile: a checked profile (``load_profile``).
        say: where progress lines go.
    """
    folder = grid.state_dir / "slurm"
    # slurmctld sends the signal at the first of its 30 s checks within `signal_delay_s` + 30 s of
    # the limit, and kills at a later check: a stop gets at least 30 s.
    grace_s = max(20.0, profile.get("slurm_signal_delay_s", 90) / 2)
    groups: dict[tuple[int, int, int], list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell_resources(cell.config.train, profile.get("gpus_per_node", 0)), []).append(cell)
    for resources, group in groups.items():
        executor = _executor(folder, profile, resources, grid.name)
        try:
            with executor.batch():
                jobs = [executor.submit(CellJob(c.name, str(c.run_dir), config_to_dict(c.config), grace_s,
                                                c.plan and c.plan.as_dict())) for c in group]
        except FailedJobError as e:  # sbatch's own message, e.g. an invalid partition or account
            raise ValueError(f"sbatch refused the jobs of {len(group)} cell(s): {str(e).strip()}") from None
        add_records(grid, {
            cell.name: {
                "executor": SlurmExecutor.name, "job_id": job.job_id, "log": str(job.paths.stdout),
                "result": str(job.paths.result_pickle), "submitted": now(),
            }
            for cell, job in zip(group, jobs)
        })
        nodes, tasks, gpus = resources
        array = jobs[0].job_id.split("_")[0]
        say(
            f"submitted {len(group)} cell(s) as SLURM job {array} "
            f"({nodes} node(s) x {tasks} task(s), {gpus} GPU(s) per node each); logs in {folder}"
        )
