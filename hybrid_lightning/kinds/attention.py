"""Softmax attention: full (``F``) and sliding-window (``S``). Their options are the model's attention
settings; neither has a section of its own."""

from __future__ import annotations

from dataclasses import dataclass

from hybrid_lightning.kinds.base import MixerKind, MixerOptions

FULL = "full"  # the full-attention kind: pattern letter F


@dataclass(frozen=True)
class AttentionOptions(MixerOptions):
    """Heads, GQA, QK-norm, RoPE base and the kernel."""

    n_heads: int
    kv_heads: int
    head_dim: int
    qk_norm: bool
    rope_theta: float
    backend: str  # model.attn_backend


KINDS = (
    MixerKind(FULL, "F", attention=True, uses_position=True, options=AttentionOptions, title="full attention"),
    MixerKind("swa", "S", attention=True, has_window=True, uses_position=True, options=AttentionOptions,
              title="sliding-window attention"),
)
