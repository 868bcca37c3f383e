"""Lightning Attention (``L``; Qin et al. 2024, arXiv 2401.04658, as in MiniMax-01): its ``model.lightning``
settings and the options its layer reads."""

from __future__ import annotations

from dataclasses import dataclass

from hybrid_lightning.kinds.base import HeadsSettings, MixerKind, RecurrentOptions, register


@dataclass(frozen=True)
class LightningSettings(HeadsSettings):
    """Lightning Attention layers (``L``; Qin et al. 2024, as in MiniMax-01)."""


@dataclass(frozen=True)
class LightningOptions(RecurrentOptions):
    """Its settings, heads resolved; the decays follow from the layer's index among ``n_layers``."""

    n_heads: int
    head_dim: int
    n_layers: int


KIND = register(MixerKind(
    "lightning", "L", "hybrid_lightning.model.mixers.lightning.LightningAttention", options=LightningOptions,
    settings=LightningSettings, title="Lightning Attention", definition=__name__,
    operators=("hybrid_lightning.model.ops.gated_linear",), cpu_bf16_speedup=((128, 1.19), (64, 1.01)),
))
