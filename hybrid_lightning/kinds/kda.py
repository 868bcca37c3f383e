"""Kimi Delta Attention (``K``; Kimi Team 2025, *Kimi Linear*, arXiv 2510.26692): its ``model.kda`` settings and
the options its layer reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybrid_lightning.kinds.base import HeadsSettings, MixerKind, RecurrentOptions, register, setting


@dataclass(frozen=True)
class KDASettings(HeadsSettings):
    """Kimi Delta Attention layers (``K``; Kimi Team 2025)."""

    expand_v: float = setting(1.0, "value width per head = expand_v * head_dim", gt=0)
    conv_size: int = setting(4, "taps of the causal depthwise convolution", ge=1)

    def check(self, model: Any) -> None:
        key_dim = model.heads(self)[1]
        if key_dim * self.expand_v % 1:
            raise ValueError(f"model.kda.expand_v={self.expand_v} times the head width {key_dim} must be a whole "
                             "number")


@dataclass(frozen=True)
class KDAOptions(RecurrentOptions):
    """Its settings, heads resolved from the model's where left open."""

    n_heads: int
    head_dim: int
    expand_v: float
    conv_size: int


KIND = register(MixerKind(
    "kda", "K", "hybrid_lightning.model.mixers.kda.KimiDeltaAttention", options=KDAOptions, settings=KDASettings,
    title="Kimi Delta Attention", definition=__name__, operators=("hybrid_lightning.model.ops.kda",),
))
