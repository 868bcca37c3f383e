"""Numeric precision of a run: the Lightning precision string that ``train.precision`` resolves to, and
the autocast dtype it trains (and so evaluates) under. Plain torch, no Lightning: the trainer, the
evaluation callbacks and the offline commands on a checkpoint all ask here."""

from __future__ import annotations

import torch

from hybrid_lightning.config import TrainConfig

AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def resolve_precision(train: TrainConfig) -> str:
    """``train.precision`` as a Lightning precision string; ``auto`` is bf16-mixed on a GPU, else 32-true."""
    if train.precision != "auto":
        return "32-true" if train.precision == "32" else train.precision
    gpu = train.accelerator == "gpu" or (train.accelerator == "auto" and torch.cuda.is_available())
    return "bf16-mixed" if gpu else "32-true"


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a Lightning precision string (None for true precisions)."""
    return AUTOCAST.get(str(precision))
