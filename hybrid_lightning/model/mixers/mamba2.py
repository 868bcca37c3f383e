"""Mamba-2 as a mixer (``M``): Dao & Gu, *Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality*, ICML 2024, arXiv 2405.21060.

The layer of the paper's reference module (§7, Figure 6): one input projection to (z, x, B, C, Δ);
a short causal depthwise convolution with SiLU over (x, B, C); the SSD recurrence per head with a
data-dependent scalar decay exp(Δ·A); a skip D·x; the gated RMSNorm norm(y · SiLU(z)); an output
projection. B and C are shared by all heads (one group).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_lightning.model.init import DT_INIT, inverse_softplus_dt
from hybrid_lightning.model.mixers.recurrent import RecurrentMixer
from hybrid_lightning.model.ops import ShortConv, chunked_gla_flops, gated_linear_attention

if TYPE_CHECKING:
    from hybrid_lightning.kinds import LayerSpec, Mamba2Options

A_INIT = (1.0, 16.0)  # the reference module's initial range: A ~ U[1, 16] (Δ: model/init.py)


class Mamba2(RecurrentMixer):
    """Args: ``opts`` (``model.mamba2``: ``expand``, ``head_dim``, ``d_state``, ``conv_size``; the backend)."""

    def __init__(self, opts: Mamba2Options, spec: LayerSpec):
        super().__init__()
        self.inner = opts.expand * opts.d_model
        self.head_dim, self.d_state = opts.head_dim, opts.d_state
        self.n_heads = self.inner // self.head_dim
        self.backend, self.chunk = opts.backend, opts.chunk
        self.in_proj = nn.Linear(opts.d_model, 2 * self.inner + 2 * self.d_state + self.n_heads, bias=False)
        self.conv = ShortConv(self.inner + 2 * self.d_state, opts.conv_size, bias=True)
        self.A_log = nn.Parameter(torch.empty(self.n_heads).uniform_(*A_INIT).log())  # A = -exp(A_log)
        self.dt_bias = nn.Parameter(inverse_softplus_dt(self.n_heads, *DT_INIT))
        self.D = nn.Parameter(torch.ones(self.n_heads))
        self.norm = nn.RMSNorm(self.inner, eps=opts.norm_eps)
        self.out_proj = nn.Linear(self.inner, opts.d_model, bias=False)
        self.out_proj.residual_out = True

    def mix(self, x: torch.Tensor, state: dict | None = None, positions: torch.Tensor | None = None,
            cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, D). ``state`` carries the convolution's last inputs and the SSM state (B, H, N, P)."""
        B, T, _ = x.shape
        H, P, N = self.n_heads, self.head_dim, self.d_state
        z, xbc, dt = self.in_proj(x).split([self.inner, self.inner + 2 * N, H], dim=-1)
        xs, b, c = self.conv(xbc, state, positions).split([self.inner, N, N], dim=-1)
        dt = F.softplus(dt + self.dt_bias)  # (B, T, H)
        xs = xs.view(B, T, H, P)
        y, ssm = gated_linear_attention(
            c[:, :, None],  # queries: C, (B, T, 1, N) shared by the heads
            b[:, :, None],  # keys: B
            xs * dt[..., None],  # values: Δ·x, (B, T, H, P)
            dt * -self.A_log.exp(),  # log-decay Δ·A
            scale=1.0, state=None if state is None else state.get("ssm"), backend=self.backend, chunk_size=self.chunk,
            cu_seqlens=cu_seqlens,
        )
        if state is not None:
            state["ssm"] = ssm
        y = torch.addcmul(y, xs, self.D[:, None])  # y + D·x, (B, T, H, P)
        return self.out_proj(self.norm(y.reshape(B, T, self.inner) * F.silu(z)))

    def flops_per_token(self, T: int) -> float:
        """Training FLOPs per token of the SSD recurrence beyond the layer's weights (B and C shared by the heads)."""
        return chunked_gla_flops(T, self.chunk, self.n_heads, self.d_state, self.head_dim, shared_qk=True)
