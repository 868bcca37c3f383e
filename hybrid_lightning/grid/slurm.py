"""The ``slurm`` executor: cells submitted with submitit as job arrays; their state from ``squeue``,
slurmstepd's last words in the log and submitit's result files.

A profile (``slurm/<cluster>.yaml``) is a mapping of submitit ``AutoExecutor`` parameters:
``timeout_min``, ``cpus_per_task``, ``mem_gb``, ``slurm_partition``, ``slurm_array_parallelism``,
``slurm_setup``, ``slurm_additional_parameters``, ... plus the executor's own
``slurm_max_num_timeout``. The world of a cell follows from its config, one task per device:
``train.num_nodes`` nodes, ``train.devices`` tasks per node, and as many GPUs per node on GPU
cells; a profile's ``gpus_per_node`` is the default for cells with ``train.devices: auto``.
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

from hybrid_lightning.config import TrainConfig, config_to_dict, suggest
from hybrid_lightning.grid.capacity import GPU_KEY
from hybrid_lightning.grid.executor import Executor, register
from hybrid_lightning.grid.job import CellJob
from hybrid_lightning.grid.spec import Cell, Grid
from hybrid_lightning.grid.state import add_records, now

# Arguments of submitit's SlurmExecutor constructor rather than of update_parameters.
_CONSTRUCTOR_KEYS = {"slurm_max_num_timeout", "slurm_max_pickle_size_gb", "slurm_python"}
# The world a cell trains in is the cell's own setting (train.devices, train.num_nodes): one owner.
_FROM_CELL = {
    "nodes": "train.num_nodes", "tasks_per_node": "train.devices", "slurm_nodes": "train.num_nodes",
    "slurm_ntasks_per_node": "train.devices", "slurm_gpus_per_node": "train.devices (and gpus_per_node)",
    "slurm_num_gpus": "train.devices (and gpus_per_node)", "slurm_gpus_per_task": "train.devices (and gpus_per_node)",
}
# slurmstepd's last words in a job's log when it is killed: "*** JOB 12 ON node CANCELLED AT <time> [DUE TO ...] ***"
_KILLED = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))? \*\*\*")
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

    def check(self) -> None:
        self.settings = load_profile(self.profile)
        check_slurm()

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
        """(time, cause) from slurmstepd's last words in the log: cause '' for scancel, else e.g. 'TIME LIMIT'."""
        log = record.get("log")
        if not log or not Path(log).is_file():
            return None
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 20000))
            tail = f.read().decode(errors="replace")
        # A requeue also kills the job step, but the job goes on: not an ending.
        found = [(when, cause) for when, cause in _KILLED.findall(tail) if cause != "JOB REQUEUE"]
        return found[-1] if found else None

    def failure(self, record: dict) -> str | None:
        """The last line of the traceback submitit pickled for a job that raised."""
        result = record.get("result")
        if not result or not Path(result).is_file():
            return None
        try:
            with open(result, "rb") as f:
                kind, payload = pickle.load(f)
        except Exception:  # a result being written or unreadable says nothing
            return None
        if kind != "error":
            return None
        lines = [line for line in str(payload).strip().splitlines() if line.strip()]
        return lines[-1] if lines else None


def _grid_state(state: str, restarts: int) -> str:
    """A live job's ``squeue`` state and restart count as a grid state."""
    if state == "PENDING":
        return "requeued" if restarts else "pending"
    return _LIVE_STATES.get(state, state.lower())


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


def _valid_keys() -> set[str]:
    slurm = {f"slurm_{k}" for k in submitit.SlurmExecutor._valid_parameters()}
    return set(submitit.AutoExecutor._valid_parameters()) | slurm | _CONSTRUCTOR_KEYS


def load_profile(path: str | Path | None) -> dict:
    """Reads and checks a profile; a ``ValueError`` names a missing file or a bad key."""
    if path is None:
        raise ValueError("--executor slurm needs --profile: a YAML file of submitit AutoExecutor parameters (see slurm/example.yaml)")
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
    valid = _valid_keys()
    for key in profile:
        if key in _FROM_CELL:
            raise ValueError(f"profile {path}: '{key}' follows from each cell ({_FROM_CELL[key]}); remove it from the profile")
        if key not in valid:
            hint = suggest(key, sorted(valid), cutoff=0.6)
            raise ValueError(f"profile {path}: unknown submitit parameter '{key}'{hint}")
    gpus = profile.get("gpus_per_node", 0)
    if not isinstance(gpus, int) or gpus < 0:
        raise ValueError(f"profile {path}: gpus_per_node must be a whole number >= 0, got {gpus!r}")
    # submitit checks the names and types; its local flavour does so without SLURM on this machine.
    _executor(path.parent, profile, (1, 1, gpus), "check", path, cluster="local")
    return profile


def cell_resources(train: TrainConfig, default_gpus: int) -> tuple[int, int, int]:
    """(nodes, tasks per node, GPUs per node) of a cell: one task per device.

    Args:
        train: the cell's ``train`` section (accelerator, devices, num_nodes).
        default_gpus: the profile's ``gpus_per_node``, used when ``train.devices`` is ``auto``.
    """
    devices = None if train.devices == "auto" else train.devices
    if train.accelerator == "cpu":
        gpus = 0
    elif devices is not None and (train.accelerator == "gpu" or default_gpus):
        gpus = devices
    elif train.accelerator == "gpu":
        gpus = default_gpus or 1
    else:
        gpus = default_gpus
    return train.num_nodes, gpus or devices or 1, gpus


def _executor(
    folder: Path, profile: dict, resources: tuple[int, int, int], name: str, where: Path | None = None, cluster: str = "slurm"
) -> submitit.AutoExecutor:
    nodes, tasks, gpus = resources
    params = {"name": name, "stderr_to_stdout": True}  # one log per task: the researcher reads one file
    params.update({k: v for k, v in profile.items() if k not in _CONSTRUCTOR_KEYS and k != "gpus_per_node"})
    params.update(nodes=nodes, tasks_per_node=tasks, gpus_per_node=gpus or None)
    try:
        constructor = {k: profile[k] for k in _CONSTRUCTOR_KEYS & set(profile)}
        executor = submitit.AutoExecutor(folder=folder, cluster=cluster, **constructor)
        executor.update_parameters(**params)
    except (NameError, AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"profile {where or ''}: {e}") from None
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
                jobs = [executor.submit(CellJob(c.name, str(c.run_dir), config_to_dict(c.config), grace_s)) for c in group]
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
