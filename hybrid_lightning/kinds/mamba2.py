"""Mamba-2 (``M``; Dao & Gu 2024, arXiv 2405.21060): its ``model.mamba2`` settings, the defaults of the
paper's reference module, and the options its layer reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybrid_lightning.kinds.base import MixerKind, RecurrentOptions, register, setting


@dataclass(frozen=True)
class Mamba2Settings:
    """Mamba-2 layers (``M``); defaults of the paper's reference module (Dao & Gu 2024)."""

    expand: int = setting(2, "inner width = expand * d_model", ge=1)
    head_dim: int = setting(64, "channels per SSM head; must divide expand * d_model", ge=1)
    d_state: int = setting(128, "SSM state size N", ge=1)
    conv_size: int = setting(4, "taps of the causal depthwise convolution", ge=1)

    def check(self, model: Any) -> None:
        inner = self.expand * model.d_model
        if inner % self.head_dim:
            raise ValueError(f"model.mamba2.head_dim={self.head_dim} must divide model.mamba2.expand * model.d_model = "
                             f"{inner}")


@dataclass(frozen=True)
class Mamba2Options(RecurrentOptions):
    """Inner width ``expand * d_model`` in heads of ``head_dim`` channels."""

    expand: int
    head_dim: int
    d_state: int
    conv_size: int


KIND = register(MixerKind(
    "mamba2", "M", "hybrid_lightning.model.mixers.mamba2.Mamba2", options=Mamba2Options, settings=Mamba2Settings,
    title="Mamba-2", definition=__name__, operators=("hybrid_lightning.model.ops.gated_linear",),
    cpu_bf16_speedup=((128, 1.09), (64, 1.00)),
))
