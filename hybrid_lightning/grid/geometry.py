"""The world a cell asks SLURM for, and the checks, before anything is submitted, that it can be had.

A cell's world is its own setting, one task per device (``cell_resources``): ``train.num_nodes``
nodes x ``train.devices`` tasks per node, and as many GPUs per node on GPU cells. A profile or
``--set`` may repeat it (``nodes``, ``tasks_per_node``, ...) but not contradict it
(``check_profile_world``). The partition must hold it: ``train.num_nodes`` nodes, each with the
CPUs (tasks x ``cpus_per_task``) and GPUs it asks (``check_partition``, from ``sinfo``).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from hybrid_lightning.config import TrainConfig
from hybrid_lightning.grid.spec import Cell

World = tuple[int, int, int]  # (nodes, tasks per node, GPUs per node)
# Profile keys that state a part of the world: key -> index in World
WORLD_KEYS = {"nodes": 0, "slurm_nodes": 0, "tasks_per_node": 1, "slurm_ntasks_per_node": 1, "slurm_gpus_per_node": 2}
_SETTING = ("train.num_nodes", "train.devices", "train.devices")  # the cell's setting behind each part
# Profile keys that ask for GPUs other than per node: the cell's train.devices sets GPUs per node.
GPU_KEYS = {"slurm_num_gpus", "slurm_gpus_per_task"}
# "gpu:2", "gpu:a100:4(S:0-1)", "gpu:2,mps:200": GPUs of a node as sinfo's %G shows its GRES
_GPUS = re.compile(r"\bgpu(?::[^:,(\s]+)?:(\d+)")


def cell_resources(train: TrainConfig, default_gpus: int) -> World:
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


def check_profile_world(cells: Sequence[Cell], profile: dict, origin: dict[str, str]) -> None:
    """Refuses a profile key that states the world otherwise than a cell does, in one line naming both.

    Args:
        cells: the grid's cells.
        profile: a loaded profile (``slurm.load_profile``).
        origin: key -> where it was set (``profile slurm/x.yaml`` or ``--set``).
    """
    for key, part in WORLD_KEYS.items():
        if key not in profile:
            continue
        for cell in cells:
            world = cell_resources(cell.config.train, profile.get("gpus_per_node", 0))
            if profile[key] != world[part]:
                setting = _SETTING[part]
                value = getattr(cell.config.train, setting.split(".")[1])
                derived = "" if value == world[part] else f", i.e. {world[part]}"
                raise ValueError(f"{origin[key]}: {key}={profile[key]} disagrees with cell {cell.name}'s "
                                 f"{setting}={value}{derived}; the cell's setting decides: drop {key} or change "
                                 f"{setting}")


@dataclass(frozen=True)
class Node:
    """A node of a partition as ``sinfo`` shows it."""

    name: str
    cpus: int
    gpus: int


def partition_nodes(partition: str | None) -> tuple[str, list[Node]] | None:
    """The name and nodes of ``partition`` (None: the cluster's default partition), from ``sinfo``;
    None when SLURM does not answer here, a ``ValueError`` when the partition is not one of its."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%P|%N|%c|%G"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):  # no sinfo here, or no answer
        return None
    if out.returncode:
        return None
    nodes: dict[str, list[Node]] = {}
    default = None
    for line in out.stdout.splitlines():
        name, node, cpus, gres = line.strip().split("|")
        if name.endswith("*"):
            name = default = name[:-1]
        nodes.setdefault(name, []).append(Node(node, int(cpus), sum(int(n) for n in _GPUS.findall(gres))))
    partition = partition or default
    if partition not in nodes:
        raise ValueError((f"slurm_partition: {partition!r} is not a partition of this cluster "
                          f"(sinfo lists {sorted(nodes)})") if partition
                         else "the cluster has no default partition: set slurm_partition in the profile")
    return partition, nodes[partition]


def check_partition(cells: Sequence[Cell], profile: dict, partition: str, nodes: list[Node]) -> None:
    """Refuses a cell whose world the partition cannot hold: too few nodes, or nodes with too few
    CPUs (tasks per node x ``cpus_per_task``) or GPUs; one line naming the cell's setting and the
    partition's nodes."""
    cpus_per_task = profile.get("cpus_per_task", profile.get("slurm_cpus_per_task")) or 1
    for cell in cells:
        train = cell.config.train
        n, tasks, gpus = cell_resources(train, profile.get("gpus_per_node", 0))
        cpus = tasks * cpus_per_task
        fit = [node for node in nodes if node.cpus >= cpus and node.gpus >= gpus]
        if len(fit) >= n:
            continue
        where = f"partition {partition!r}"
        if n > len(nodes):
            problem = f"train.num_nodes={n}, but {where} has {len(nodes)} node(s)"
        elif cpus > max(node.cpus for node in nodes):
            problem = (f"{tasks} task(s) per node (train.devices={train.devices}) x cpus_per_task={cpus_per_task} "
                       f"= {cpus} CPUs per node, but the nodes of {where} have at most "
                       f"{max(node.cpus for node in nodes)}")
        elif gpus > max(node.gpus for node in nodes):
            problem = (f"{gpus} GPU(s) per node (train.devices={train.devices}), but the nodes of {where} have at most "
                       f"{max(node.gpus for node in nodes)}")
        else:
            problem = (f"train.num_nodes={n} nodes with {cpus} CPUs and {gpus} GPU(s) each, but {where} has "
                       f"{len(fit)} such node(s)")
        raise ValueError(f"cell {cell.name}: {problem}")
