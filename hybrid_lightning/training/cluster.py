"""How the training processes of a run start, checked before anything is prepared: as the tasks of
a SLURM job step (``srun``, one task per device), or as processes Lightning starts on this machine.

Two launches hang instead of failing, and are refused here:

- ``train`` in a SLURM allocation of several tasks or nodes but outside ``srun`` (the batch script
  itself, or an ``salloc`` shell): Lightning takes the allocation's task count as the world size
  and waits at "Initializing distributed" for tasks that were never started.
- ``train.devices`` above this machine's cores on CPU: Lightning starts that many processes here.

And one address is set: Lightning's ``SLURMEnvironment`` rendezvous at the first node's *name*
(``n[1-2]`` -> ``n1``), which need not resolve (a node reached by ``NodeAddr``, as the nodes of
``slurm/local-cluster.sh up --nodes N``); ``set_main_address`` then takes that node's ``NodeAddr``.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess

from hybrid_lightning.config import TrainConfig
from hybrid_lightning.training.threads import cores_given


def in_srun_step() -> bool:
    """Whether this process is a task of a SLURM job step, as ``srun`` starts them (the batch script
    and an ``salloc`` shell have a job id but no step id)."""
    return "SLURM_STEP_ID" in os.environ


def machine_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def trains_on_cpu_here(train: TrainConfig) -> bool:
    """Whether the run trains on CPU on this machine: ``train.accelerator`` is ``cpu``, or ``auto`` without a GPU."""
    import torch

    return train.accelerator == "cpu" or (train.accelerator == "auto" and not torch.cuda.is_available())


def check_cpu_devices(train: TrainConfig, on_cpu: bool | None = None, cores: int | None = None) -> None:
    """Refuses more CPU training processes on one node than this machine has cores.

    Args:
        train: the run's ``train`` section.
        on_cpu: whether the run trains on CPU; default: ``train.accelerator`` is ``cpu`` (``auto`` means
            the GPUs of the machine that runs it, when it is not this one).
        cores: the machine's cores; default ``machine_cores()``.
    """
    on_cpu = train.accelerator == "cpu" if on_cpu is None else on_cpu
    cores = machine_cores() if cores is None else cores
    if on_cpu and train.devices != "auto" and train.devices > cores:
        raise ValueError(
            f"train.devices={train.devices} on CPU (train.accelerator={train.accelerator}) starts {train.devices} "
            f"training processes on one node, but this machine has {cores} cores; set train.devices to at most {cores}"
        )


# What a launcher of several nodes sets in each process (torchrun, Lightning's own multi-node environment).
_LAUNCHED = ("WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def check_launch(train: TrainConfig) -> None:
    """Refuses, before anything is prepared, a launch that would hang or crowd this machine (see the
    module's docstring), and more threads per process than its cores."""
    if train.threads != "auto" and train.threads > cores_given():
        raise ValueError(f"train.threads={train.threads}, but this process may run on {cores_given()} cores; set "
                         f"train.threads to at most {cores_given()} (or auto)")
    if in_srun_step():  # one process per task: SLURM placed them
        return
    env = os.environ
    if train.num_nodes > 1 and "SLURM_JOB_ID" not in env and not any(k in env for k in _LAUNCHED):
        raise ValueError(f"train.num_nodes={train.num_nodes}, but this process runs outside a cluster (no SLURM job, "
                         "no torchrun), so it would wait for nodes that never come; submit it with `hybrid-lightning "
                         "grid submit --executor slurm`, or start one process per node with srun or torchrun")
    if "SLURM_JOB_ID" in env:
        from lightning.pytorch.plugins.environments import SLURMEnvironment  # here: a preview needs no Lightning

        tasks, nodes = int(env.get("SLURM_NTASKS", "1")), int(env.get("SLURM_JOB_NUM_NODES", "1"))
        # Lightning reads the allocation as the world unless the job is named bash or interactive
        if (SLURMEnvironment.detect() and tasks > 1) or train.num_nodes > 1:
            raise ValueError(
                f"train runs in SLURM job {env['SLURM_JOB_ID']} ({nodes} node(s), {tasks} task(s)) but not in a task "
                f"started by srun, so it would wait at 'Initializing distributed' for tasks that never start; run "
                f"`srun hybrid-lightning train ...` in the job (one task per device: --nodes=train.num_nodes, "
                f"--ntasks-per-node=train.devices), or submit with `hybrid-lightning grid submit --executor slurm`"
            )
    check_cpu_devices(train, trains_on_cpu_here(train))


def set_main_address() -> None:
    """In a SLURM task of a job of several tasks, with no ``MASTER_ADDR`` given: when the first node's
    name does not resolve, ``MASTER_ADDR`` becomes its ``NodeAddr`` (``scontrol show node``); a
    ``ValueError`` when neither gives an address."""
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    env = os.environ
    if "MASTER_ADDR" in env or not in_srun_step() or int(env.get("SLURM_NTASKS", "1")) < 2:
        return
    first = SLURMEnvironment.resolve_root_node_address(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", ""))
    try:
        socket.getaddrinfo(first, None)
        return  # Lightning's own choice works
    except (socket.gaierror, UnicodeError):
        pass
    try:
        out = subprocess.run(["scontrol", "show", "node", first, "-o"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    found = re.search(r"\bNodeAddr=(\S+)", out)
    if not found or found.group(1) == first:
        raise ValueError(f"the job's first node {first!r} does not resolve and scontrol gives no NodeAddr for it; "
                         f"set MASTER_ADDR to its address")
    env["MASTER_ADDR"] = found.group(1)
    print(f"node {first} does not resolve: MASTER_ADDR={found.group(1)} (its NodeAddr)", flush=True)
