"""Gated DeltaProduct (``P``; Siems et al. 2025, *DeltaProduct*, arXiv 2502.10297): its
``model.gated_deltaproduct`` settings and the options its layer reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybrid_lightning.kinds.base import HeadsSettings, MixerKind, RecurrentOptions, register, setting


@dataclass(frozen=True)
class GatedDeltaProductSettings(HeadsSettings):
    """Gated DeltaProduct layers (``P``; Siems et al. 2025)."""

    expand_v: float = setting(2.0, "value width per head = expand_v * head_dim", gt=0)
    conv_size: int = setting(4, "taps of the causal depthwise convolution", ge=1)
    householder: int = setting(2, "delta-rule (Householder) steps per token, n_h", ge=1)

    def check(self, model: Any) -> None:
        key_dim = model.heads(self)[1]
        if key_dim * self.expand_v % 1:
            raise ValueError(f"model.gated_deltaproduct.expand_v={self.expand_v} times the head width {key_dim} "
                             "must be a whole number")


@dataclass(frozen=True)
class GatedDeltaProductOptions(RecurrentOptions):
    """Its settings, heads resolved from the model's where left open."""

    n_heads: int
    head_dim: int
    expand_v: float
    conv_size: int
    householder: int


KIND = register(MixerKind(
    "gated_deltaproduct", "P", "hybrid_lightning.model.mixers.gated_deltaproduct.GatedDeltaProduct",
    options=GatedDeltaProductOptions, settings=GatedDeltaProductSettings, title="Gated DeltaProduct",
    definition=__name__,
    operators=("hybrid_lightning.model.ops.delta_rule", "hybrid_lightning.model.ops.delta_product"),
))
