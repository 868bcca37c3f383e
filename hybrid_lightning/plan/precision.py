"""Numeric precision of a run: the Lightning precision string that ``train.precision`` resolves to, and
the autocast dtype it trains (and so evaluates) under. Plain torch, no Lightning: the trainer, the
evaluation callbacks and the offline commands on a checkpoint all ask here."""

from __future__ import annotations

import torch

from hybrid_lightning.config import ModelConfig, TrainConfig
from hybrid_lightning.kinds import FULL

AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}

# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, by a substring of the device's name; the MFU
# logged in training and in the GPU benchmark divides by these. Lightning's own table
# (lightning.fabric.utilities.throughput.get_available_flops) knows "H200" only with an SXM/NVL suffix.
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "H800": 989.4, "A100": 312.0, "L40S": 362.1}


def peak_bf16_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its name (``torch.cuda.get_device_name``); None when unknown."""
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)

# A CPU training step's fp32 time over its bf16-autocast time (one thread, batch 8; 4 layers, T = 512 at
# d=128 and T = 256 at d=64), by d_model and by the efficient mixer of the 3 : 1 hybrid ("full": all
# layers full attention). Measured by bench section (c), its "CPU, one thread" rows, committed in
# analysis/results/bench/training.json; tests/test_perf.py checks that this table matches that file.
CPU_BF16_SPEEDUP = {
    128: {"full": 1.17, "swa": 0.97, "mamba2": 1.09, "gated_deltanet": 1.09, "lightning": 1.19},
    64: {"full": 0.95, "swa": 0.73, "mamba2": 1.00, "gated_deltanet": 0.97, "lightning": 1.01},
}
CPU_BF16_MARGIN = 1.05  # bf16 only where it measured at least 5% faster: closer is within the timing noise


def cpu_native_bf16() -> bool:
    """Whether this CPU has bf16 instructions (AVX512-BF16 or AMX). Without them oneDNN emulates bf16: d=128 full
    attention's step measured 0.83x fp32's speed with AVX-512 alone and 0.15x with AVX2 alone (the same machine
    with ``ONEDNN_MAX_CPU_ISA`` limited; docs/training.md)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve_precision(train: TrainConfig, model: ModelConfig) -> str:
    """``train.precision`` as a Lightning precision string. ``auto`` is bf16-mixed on a GPU; on a CPU with
    bf16 instructions, bf16-mixed only for architectures measured faster under it (``CPU_BF16_SPEEDUP``);
    else 32-true."""
    if train.precision != "auto":
        return "32-true" if train.precision == "32" else train.precision
    gpu = train.accelerator == "gpu" or (train.accelerator == "auto" and torch.cuda.is_available())
    return "bf16-mixed" if gpu or (cpu_native_bf16() and cpu_bf16_faster(model)) else "32-true"


def cpu_bf16_faster(model: ModelConfig) -> bool:
    """Whether bf16 autocast measured faster on CPU for every efficient mixer of ``model`` (for full
    attention when it has none), at the measured d_model nearest to its own."""
    measured = CPU_BF16_SPEEDUP[min(CPU_BF16_SPEEDUP, key=lambda d: abs(d - model.d_model))]
    mixers = set(model.mixers_used)
    return all(measured.get(m, 0.0) >= CPU_BF16_MARGIN for m in (mixers - {FULL} or {FULL}))


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a Lightning precision string (None for true precisions)."""
    return AUTOCAST.get(str(precision))
