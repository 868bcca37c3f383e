"""Kimi Delta Attention as a mixer (``K``): Kimi Team, *Kimi Linear: An Expressive, Efficient Attention
Architecture*, arXiv 2510.26692 (§3, the layer of fla's ``KimiDeltaAttention``).

Per head: q, k, v from one projection through a short causal depthwise convolution with SiLU; q and k
L2-normalised; the writing strength β = σ(W_β x); a decay per key channel,
α = exp(-exp(A_log)·softplus(W_f↑ W_f↓ x + Δ_bias)) through a low-rank projection of rank head_dim;
the per-channel gated delta rule; the output RMSNorm(o) · σ(W_g↑ W_g↓ x), the gate low-rank as well;
an output projection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_lightning.model.init import DT_INIT, inverse_softplus_dt
from hybrid_lightning.model.mixers.recurrent import RecurrentMixer
from hybrid_lightning.model.ops import ShortConv
from hybrid_lightning.model.ops.kda import chunked_kda_flops, kda

if TYPE_CHECKING:
    from hybrid_lightning.kinds import LayerSpec
    from hybrid_lightning.kinds.kda import KDAOptions

A_INIT = (1.0, 16.0)  # fla's KimiDeltaAttention draws A ~ U[1, 16]


def low_rank(d_in: int, rank: int, d_out: int, bias: bool) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, rank, bias=False), nn.Linear(rank, d_out, bias=bias))


class KimiDeltaAttention(RecurrentMixer):
    """Args: ``opts`` (``model.kda``, heads resolved: ``n_heads``, ``head_dim``, ``expand_v``, ``conv_size``;
    the backend)."""

    def __init__(self, opts: KDAOptions, spec: LayerSpec):
        super().__init__()
        self.n_heads, self.key_dim = opts.n_heads, opts.head_dim
        self.value_dim = round(self.key_dim * opts.expand_v)
        self.backend, self.chunk = opts.backend, opts.chunk
        H, K, V = self.n_heads, self.key_dim, self.value_dim
        self.qkv = nn.Linear(opts.d_model, H * (2 * K + V), bias=False)
        self.conv = ShortConv(H * (2 * K + V), opts.conv_size, bias=False)
        self.decay = low_rank(opts.d_model, V, H * K, bias=False)  # W_f↓, W_f↑
        self.beta = nn.Linear(opts.d_model, H, bias=False)
        self.A_log = nn.Parameter(torch.empty(H).uniform_(*A_INIT).log())
        self.dt_bias = nn.Parameter(inverse_softplus_dt(H * K, *DT_INIT))
        self.gate = low_rank(opts.d_model, V, H * V, bias=True)  # W_g↓, W_g↑
        self.out_norm = nn.RMSNorm(V, eps=opts.norm_eps)
        self.out_proj = nn.Linear(H * V, opts.d_model, bias=False)
        self.out_proj.residual_out = True

    def mix(self, x: torch.Tensor, state: dict | None = None, positions: torch.Tensor | None = None,
            cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, D). ``state`` carries the convolution's last inputs and the delta-rule state (B, H, K, V)."""
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.key_dim, self.value_dim
        q, k, v = self.conv(self.qkv(x), state, positions).split([H * K, H * K, H * V], dim=-1)
        q = F.normalize(q.view(B, T, H, K), dim=-1)
        k = F.normalize(k.view(B, T, H, K), dim=-1)
        log_decay = -self.A_log.exp()[:, None] * F.softplus((self.decay(x) + self.dt_bias).view(B, T, H, K))
        o, memory = kda(
            q, k, v.view(B, T, H, V), log_decay, self.beta(x).sigmoid(),
            scale=K**-0.5, state=None if state is None else state.get("memory"),
            backend=self.backend, chunk_size=self.chunk, cu_seqlens=cu_seqlens,
        )
        if state is not None:
            state["memory"] = memory
        o = self.out_norm(o) * self.gate(x).view(B, T, H, V).sigmoid()  # (B, T, H, V)
        return self.out_proj(o.reshape(B, T, H * V))

    def flops_per_token(self, T: int) -> float:
        """Training FLOPs per token of the per-channel gated delta rule beyond the layer's weights."""
        return chunked_kda_flops(T, self.chunk, self.n_heads, self.key_dim, self.value_dim)
