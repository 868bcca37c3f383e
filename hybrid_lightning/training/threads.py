"""The CPU threads a training process computes with (``torch.set_num_threads``), chosen one way for ``train``, its
dry run and a grid's cells: ``train.threads`` where the config sets it; else ``OMP_NUM_THREADS`` where the
environment sets it (as a user may, and as the local executor does for each cell: ``grid/local.py``); else the
cores this process was given (``SLURM_CPUS_PER_TASK`` under SLURM, else the CPUs its affinity mask allows:
``taskset``, cgroups), shared by the run's processes on this node. Torch's own default is the machine's physical
cores, whatever this process was given."""

from __future__ import annotations

import os

from hybrid_lightning.config import TrainConfig


def cores_given() -> int:
    """The cores this process may compute on: SLURM's ``--cpus-per-task`` where SLURM set it, else the CPUs of its
    affinity mask."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def share(processes: int) -> int:
    """Threads for each of ``processes`` processes sharing ``cores_given()`` (at least 1)."""
    return max(1, cores_given() // max(1, processes))


def thread_count(train: TrainConfig) -> int:
    """The threads of one training process of a run with ``train`` (see the module's docstring)."""
    if train.threads != "auto":
        return train.threads
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    local = train.devices if train.accelerator == "cpu" and train.devices != "auto" else 1  # CPU processes on this node
    return share(local)


def set_threads(train: TrainConfig) -> int:
    """Sets this process's torch threads to ``thread_count(train)``; returns them."""
    import torch

    n = thread_count(train)
    torch.set_num_threads(n)
    return n
