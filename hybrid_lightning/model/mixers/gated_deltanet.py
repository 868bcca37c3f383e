"""Gated DeltaNet as a mixer (``G``): Yang, Kautz & Hatamizadeh, *Gated Delta Networks: Improving
Mamba2 with Delta Rule*, ICLR 2025, arXiv 2412.06464.

Per head: q, k, v from one projection through a short causal depthwise convolution with SiLU;
q and k L2-normalised; the writing strength β = σ(W_β x); the decay α = exp(-exp(A_log)·softplus(W_α x + Δ_bias))
(Mamba-2's parametrisation, §3.3); the gated delta rule; the output RMSNorm(o) · SiLU(W_g x);
an output projection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_lightning.model.init import DT_INIT, inverse_softplus_dt
from hybrid_lightning.model.mixers.recurrent import RecurrentMixer
from hybrid_lightning.model.ops import ShortConv, chunked_delta_rule_flops, gated_delta_rule

if TYPE_CHECKING:
    from hybrid_lightning.kinds import GatedDeltaNetOptions, LayerSpec

A_INIT = (0.0, 16.0)  # the paper's released layer draws A ~ U[0, 16]


class GatedDeltaNet(RecurrentMixer):
    """Args: ``opts`` (``model.gated_deltanet``, heads resolved: ``n_heads``, ``head_dim``, ``expand_v``, ``conv_size``;
    the backend)."""

    def __init__(self, opts: GatedDeltaNetOptions, spec: LayerSpec):
        super().__init__()
        self.n_heads, self.key_dim = opts.n_heads, opts.head_dim
        self.value_dim = round(self.key_dim * opts.expand_v)
        self.backend, self.chunk = opts.backend, opts.chunk
        H, K, V = self.n_heads, self.key_dim, self.value_dim
        self.qkv = nn.Linear(opts.d_model, H * (2 * K + V), bias=False)
        self.conv = ShortConv(H * (2 * K + V), opts.conv_size, bias=False)
        self.decay_beta = nn.Linear(opts.d_model, 2 * H, bias=False)  # W_α and W_β
        self.A_log = nn.Parameter(torch.empty(H).uniform_(*A_INIT).log())
        self.dt_bias = nn.Parameter(inverse_softplus_dt(H, *DT_INIT))
        self.gate = nn.Linear(opts.d_model, H * V, bias=False)
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
        a, b = self.decay_beta(x).chunk(2, dim=-1)  # (B, T, H) each
        o, memory = gated_delta_rule(
            q, k, v.view(B, T, H, V),
            -self.A_log.exp() * F.softplus(a + self.dt_bias),  # log α
            b.sigmoid(),  # β
            scale=K**-0.5, state=None if state is None else state.get("memory"),
            backend=self.backend, chunk_size=self.chunk, cu_seqlens=cu_seqlens,
        )
        if state is not None:
            state["memory"] = memory
        o = self.out_norm(o) * F.silu(self.gate(x).view(B, T, H, V))  # (B, T, H, V)
        return self.out_proj(o.reshape(B, T, H * V))

    def flops_per_token(self, T: int) -> float:
        """Training FLOPs per token of the gated delta rule beyond the layer's weights."""
        return chunked_delta_rule_flops(T, self.chunk, self.n_heads, self.key_dim, self.value_dim)
