"""What ``grid plan`` assumes of the GPU that will train a grid: its memory, which each cell's estimated peak
must fit (``plan.memory.fitting_setting`` names a setting that fits where it does not), and its sustained
training speed, for GPU-hours. A SLURM profile states its cluster's GPU under ``gpu:`` (``slurm/example.yaml``;
the SLURM executor passes the rest to submitit); without one, ``DEFAULT_GPU``, named in the output.
``--tflops`` or ``--throughput`` replace the speed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hybrid_lightning.config import read_yaml
from hybrid_lightning.runplan import GIB

GPU_KEY = "gpu"  # a profile's section read here, not passed to submitit


@dataclass(frozen=True)
class Gpu:
    """Args:
        name: what the output calls it.
        memory_gib: its memory, GiB.
        tflops: sustained training TFLOP/s of one GPU on these models: GPU-hours from each cell's FLOPs per token.
        throughput: training tokens/s of one GPU, the same for every cell (``--throughput``); replaces ``tflops``.
        source: where the numbers come from, as the output states it.
    """

    name: str
    memory_gib: float
    tflops: float | None
    source: str
    throughput: float | None = None

    @property
    def memory(self) -> int:
        return int(self.memory_gib * GIB)

    def tokens_per_s(self, flops_per_token: float) -> float:
        """Training tokens per second of one GPU on a model of ``flops_per_token``."""
        return self.throughput or self.tflops * 1e12 / flops_per_token

    def speed(self) -> str:
        return f"{self.throughput:,.0f} tokens/s" if self.throughput else f"{self.tflops:g} TFLOP/s"


# An H100 80GB at 400 TFLOP/s: 40% of its dense bf16 peak (989 TFLOP/s, plan/precision.py), a utilisation that
# well-tuned training of models of these sizes reaches; state your own with --tflops or a profile's gpu: section.
DEFAULT_GPU = Gpu("H100 80GB", 80.0, 400.0, "the default")


def profile_gpu(path: str | Path) -> Gpu:
    """The ``gpu:`` section of the SLURM profile at ``path`` (``name``, ``memory_gib``, ``tflops``), ``DEFAULT_GPU``
    where it has none; a ``ValueError`` naming the profile and the key."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"profile not found: {path}")
    raw = read_yaml(path.read_text(), path) or {}
    section = raw.get(GPU_KEY) if isinstance(raw, dict) else None
    if section is None:  # a profile that only states where the cells run: the default GPU, said so
        return dataclasses.replace(DEFAULT_GPU, source=f"the default: profile {path} has no '{GPU_KEY}:' section")
    if not isinstance(section, dict):
        raise ValueError(f"profile {path}: '{GPU_KEY}:' must be a section stating the GPU (name, memory_gib, tflops); "
                         "see slurm/example.yaml")
    fields = {"name": str, "memory_gib": (int, float), "tflops": (int, float)}
    for key, kind in fields.items():
        value = section.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is not str and value <= 0):
            raise ValueError(f"profile {path}: {GPU_KEY}.{key} must be "
                             f"{'a name' if kind is str else 'a positive number'}, got {value!r}")
    unknown = sorted(set(section) - set(fields))
    if unknown:
        raise ValueError(f"profile {path}: {GPU_KEY}.{unknown[0]} is not a key of the GPU (keys: {list(fields)})")
    return Gpu(section["name"], float(section["memory_gib"]), float(section["tflops"]), f"profile {path}")


def plan_gpu(profile: str | Path | None, tflops: float | None, throughput: float | None) -> Gpu:
    """The GPU ``grid plan`` assumes: the profile's (else ``DEFAULT_GPU``), its speed replaced by ``--tflops`` or
    ``--throughput``."""
    gpu = profile_gpu(profile) if profile is not None else DEFAULT_GPU
    if tflops is not None:
        return dataclasses.replace(gpu, tflops=tflops, source=f"{gpu.source}; --tflops {tflops:g}")
    if throughput is not None:
        return dataclasses.replace(gpu, throughput=throughput, source=f"{gpu.source}; --throughput {throughput:g}")
    return gpu
