"""Numeric precision of a run: the Lightning precision string that ``train.precision`` resolves to, and
the autocast dtype it trains (and so evaluates) under. Plain torch, no Lightning: the trainer, the
evaluation callbacks and the offline commands on a checkpoint all ask here."""

from __future__ import annotations

import torch

from hybrid_lightning.config import ModelConfig, TrainConfig
from hybrid_lightning.kinds import FULL, KINDS

AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}

# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, by a substring of the device's name; the MFU
# logged in training and in the GPU benchmark divides by these. Lightning's own table
# (lightning.fabric.utilities.throughput.get_available_flops) knows "H200" only with an SXM/NVL suffix.
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "H800": 989.4, "A100": 312.0, "L40S": 362.1}


def peak_bf16_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its name (``torch.cuda.get_device_name``); None when unknown."""
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)


CPU_BF16_MARGIN = 1.05  # bf16 only where it measured at least 5% faster: closer is within the timing noise


def cpu_native_bf16() -> bool:
    """Whether this CPU has bf16 instructions (AVX512-BF16 or AMX). Without them oneDNN emulates bf16: d=128 full
    attention's step measured 0.83x fp32's speed with AVX-512 alone and 0.15x with AVX2 alone (the same machine
    with ``ONEDNN_MAX_CPU_ISA`` limited; docs/training.md).

    Private torch API: torch 2.13 has no public query of these instructions (``torch.backends.cpu.get_cpu_capability``
    names the vector width, ``AVX512`` with or without BF16 alike); tests/test_perf.py fails if these two go."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def on_gpu(train: TrainConfig) -> bool:
    """Whether the run trains on a GPU (``train.accelerator`` gpu, or auto with CUDA available)."""
    return train.accelerator == "gpu" or (train.accelerator == "auto" and torch.cuda.is_available())


def resolve_precision(train: TrainConfig, model: ModelConfig) -> str:
    """``train.precision`` as a Lightning precision string. ``auto`` is bf16-mixed on a GPU; on a CPU with
    bf16 instructions, bf16-mixed only for architectures measured faster under it (``cpu_bf16_speedups``);
    else 32-true."""
    if train.precision != "auto":
        return "32-true" if train.precision == "32" else train.precision
    return "bf16-mixed" if on_gpu(train) or (cpu_native_bf16() and cpu_bf16_faster(model)) else "32-true"


def cpu_bf16_speedups(model: ModelConfig) -> dict[str, float | None]:
    """Mixer -> its definition's measured CPU bf16 speed-up (``MixerKind.cpu_bf16_speedup``) at the measured
    d_model nearest to ``model``'s, None where it has none, for every efficient mixer of ``model`` (for full
    attention when it has none)."""
    out = {}
    for name in set(model.mixers_used) - {FULL} or {FULL}:
        measured = dict(KINDS[name].cpu_bf16_speedup)
        out[name] = measured[min(measured, key=lambda d: abs(d - model.d_model))] if measured else None
    return out


def cpu_bf16_faster(model: ModelConfig) -> bool:
    """Whether bf16 autocast measured faster on CPU for every efficient mixer of ``model`` (for full
    attention when it has none); an unmeasured mixer is not (``unmeasured_note`` says so)."""
    return all(v is not None and v >= CPU_BF16_MARGIN for v in cpu_bf16_speedups(model).values())


def unmeasured_note(train: TrainConfig, model: ModelConfig) -> str | None:
    """Where ``train.precision: auto`` keeps a CPU run in fp32 because a mixer's bf16 speed is unmeasured, the
    sentence that says so (the run plan's notes: the start line and ``--dry-run`` print it); else None."""
    if train.precision != "auto" or on_gpu(train) or not cpu_native_bf16():
        return None
    unmeasured = sorted(m for m, v in cpu_bf16_speedups(model).items() if v is None)
    if not unmeasured:
        return None
    return (f"train.precision auto: 32-true on this CPU because bf16 is unmeasured for {', '.join(unmeasured)} (no "
            "cpu_bf16_speedup in its definition; bench section (c) measures it); set train.precision to choose")


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a Lightning precision string (None for true precisions)."""
    return AUTOCAST.get(str(precision))
