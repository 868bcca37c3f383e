"""Lightning Attention as a mixer (``L``): linear attention with a fixed exponential decay per head.

Qin et al., *Lightning Attention-2: A Free Lunch for Handling Unlimited Sequence Lengths in Large
Language Models*, arXiv 2401.04658 (the operator and its chunked form), in the layer of MiniMax-01,
arXiv 2501.08313 (§2.2): q, k, v = SiLU(W x) per head, no softmax and no 1/√d scaling; head h of
layer l decays by exp(-s_h (1 - l/(L-1))) per step with ALiBi's slopes s_h = 2^(-8(h+1)/H); the
output is RMSNorm(o) · σ(W_g x), then projected.

Restricted to a receptive field of R tokens (``model/restrict.py``), exactly, through the decayed state: with a
fixed decay γ per head, the part of o_t = q_t S_t that tokens before t-R+1 contribute is γ^R q_t S_{t-R}, and
q_t S_{t-R} is the operator's output over the keys and values delayed by R tokens; the restricted output is the
difference of the two passes (2x the operator's cost; the state carries the last R keys and values).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_lightning.model.mixers.recurrent import RecurrentMixer
from hybrid_lightning.model.ops import chunked_gla_flops, gated_linear_attention

if TYPE_CHECKING:
    from hybrid_lightning.kinds import LayerSpec, LightningOptions


def decay_rates(n_heads: int, layer: int, n_layers: int) -> torch.Tensor:
    """(H,) per-step decay rates s_h · (1 - l/(L-1)); the 1e-5 terms (as in MiniMax-01) keep the
    last layer's decay above zero and a one-layer model defined."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, n_heads + 1, dtype=torch.float64) / n_heads)
    return (slopes * (1 - layer / (n_layers - 1 + 1e-5) + 1e-5)).float()


class LightningAttention(RecurrentMixer):
    """Args: ``opts`` (``model.lightning``, heads resolved: ``n_heads``, ``head_dim``; the backend); the decay
    follows from ``spec.index`` among ``opts.n_layers``."""

    restricts_itself = True  # mix honours receptive_field through its decayed state

    def __init__(self, opts: LightningOptions, spec: LayerSpec):
        super().__init__()
        self.n_heads, self.head_dim = opts.n_heads, opts.head_dim
        self.backend, self.chunk = opts.backend, opts.chunk
        inner = self.n_heads * self.head_dim
        self.qkv = nn.Linear(opts.d_model, 3 * inner, bias=False)
        self.gate = nn.Linear(opts.d_model, inner, bias=False)
        self.norm = nn.RMSNorm(inner, eps=opts.norm_eps)
        self.out_proj = nn.Linear(inner, opts.d_model, bias=False)
        self.out_proj.residual_out = True
        self.register_buffer("log_decay", -decay_rates(self.n_heads, spec.index, opts.n_layers), persistent=False)

    def mix(self, x: torch.Tensor, state: dict | None = None, positions: torch.Tensor | None = None,
            cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, D). ``state`` carries the linear-attention state (B, H, Dh, Dh); no short convolution, so
        ``positions`` go unused."""
        B, T, _ = x.shape
        H, Dh = self.n_heads, self.head_dim
        q, k, v = F.silu(self.qkv(x)).view(B, T, H, 3 * Dh).split(Dh, dim=-1)  # (B, T, H, Dh) each
        o, kv = self._operator(q, k, v, None if state is None else state.get("kv"), cu_seqlens)
        if state is not None:
            state["kv"] = kv
        if self.receptive_field is not None:
            o = o - self._beyond(q, k, v, self.receptive_field, state)
        o = self.norm(o.reshape(B, T, H * Dh)) * self.gate(x).sigmoid()
        return self.out_proj(o)

    def _operator(self, q, k, v, state: torch.Tensor | None, cu_seqlens: torch.Tensor | None = None):
        """The decayed linear attention of q, k, v (B, T, H, Dh) from ``state`` (B, H, Dh, Dh): (o, final state)."""
        B, T, H, _ = q.shape
        return gated_linear_attention(q, k, v, self.log_decay.expand(B, T, H), scale=1.0, state=state,
                                      backend=self.backend, chunk_size=self.chunk, cu_seqlens=cu_seqlens)

    def _beyond(self, q, k, v, R: int, state: dict | None) -> torch.Tensor:
        """(B, T, H, Dh): what the tokens more than R-1 before each position add to its output, γ^R q_t S_{t-R}:
        the operator over keys and values delayed by R tokens (zeros before the first), decayed R steps more.
        ``state`` carries the last R keys and values ("delayed") and that pass's state ("kv_delayed")."""
        B, T, H, Dh = k.shape
        past = k.new_zeros(B, R, H, 2 * Dh) if state is None or "delayed" not in state else state["delayed"]
        kv = torch.cat([past, torch.cat([k, v], dim=-1)], dim=1)  # (B, R + T, H, 2 Dh): keys, values
        lag_k, lag_v = kv[:, :T].split(Dh, dim=-1)  # (B, T, H, Dh): position t holds token t - R
        o, S = self._operator(q, lag_k, lag_v, None if state is None else state.get("kv_delayed"))
        if state is not None:
            state["delayed"], state["kv_delayed"] = kv[:, T:], S
        return o * (self.log_decay * R).exp().view(1, 1, H, 1).to(o.dtype)

    def flops_per_token(self, T: int) -> float:
        """Training FLOPs per token of the linear-attention recurrence beyond the layer's weights."""
        return chunked_gla_flops(T, self.chunk, self.n_heads, self.head_dim, self.head_dim)
