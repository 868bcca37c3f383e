"""Gated DeltaNet (``G``; Yang, Kautz & Hatamizadeh 2025, arXiv 2412.06464): its ``model.gated_deltanet``
settings and the options its layer reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybrid_lightning.kinds.base import HeadsSettings, MixerKind, RecurrentOptions, register, setting


@dataclass(frozen=True)
class GatedDeltaNetSettings(HeadsSettings):
    """Gated DeltaNet layers (``G``; Yang, Kautz & Hatamizadeh 2025)."""

    expand_v: float = setting(2.0, "value width per head = expand_v * head_dim", gt=0)
    conv_size: int = setting(4, "taps of the causal depthwise convolution", ge=1)

    def check(self, model: Any) -> None:
        key_dim = model.heads(self)[1]
        if key_dim * self.expand_v % 1:
            raise ValueError(
                f"model.gated_deltanet.expand_v={self.expand_v} times the head width {key_dim} must be a whole number"
            )


@dataclass(frozen=True)
class GatedDeltaNetOptions(RecurrentOptions):
    """Its settings, heads resolved from the model's where left open."""

    n_heads: int
    head_dim: int
    expand_v: float
    conv_size: int


KIND = register(MixerKind(
    "gated_deltanet", "G", "hybrid_lightning.model.mixers.gated_deltanet.GatedDeltaNet", options=GatedDeltaNetOptions,
    settings=GatedDeltaNetSettings, title="Gated DeltaNet", definition=__name__,
    operators=("hybrid_lightning.model.ops.delta_rule",), cpu_bf16_speedup=((128, 1.09), (64, 0.97)),
))
