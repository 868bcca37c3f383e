"""Softmax attention: full (``F``) and sliding-window (``S``). Their options are the model's attention
settings; neither has a section of its own."""

from __future__ import annotations

from dataclasses import dataclass

from hybrid_lightning.kinds.base import MixerKind, MixerOptions, register

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


MODULE = "hybrid_lightning.model.mixers.attention.Attention"  # one class for both: the window is an option

# cpu_bf16_speedup: full attention's is the all-full model's, SWA's the SWA-32 hybrid's (MixerKind).
register(MixerKind(FULL, "F", MODULE, attention=True, uses_position=True, options=AttentionOptions,
                   title="full attention", definition=__name__, cpu_bf16_speedup=((128, 1.17), (64, 0.95))))
register(MixerKind("swa", "S", MODULE, attention=True, has_window=True, uses_position=True, options=AttentionOptions,
                   title="sliding-window attention", definition=__name__, cpu_bf16_speedup=((128, 0.97), (64, 0.73))))
