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

from hybrid_lightning.model.mixers.recurrent import DeltaRuleMixer
from hybrid_lightning.model.ops import chunked_delta_rule_flops, gated_delta_rule

if TYPE_CHECKING:
    from hybrid_lightning.kinds import GatedDeltaNetOptions, LayerSpec

A_INIT = (0.0, 16.0)  # the paper's released layer draws A ~ U[0, 16]


class GatedDeltaNet(DeltaRuleMixer):
    """Args: ``opts`` (``model.gated_deltanet``, heads resolved: ``n_heads``, ``head_dim``, ``expand_v``, ``conv_size``;
    the backend)."""

    def __init__(self, opts: GatedDeltaNetOptions, spec: LayerSpec):
        super().__init__()
        H, K, V = self.heads(opts)
        self.inputs(opts, H * (2 * K + V))
        self.decay_beta = nn.Linear(opts.d_model, 2 * H, bias=False)  # W_α and W_β
        self.decay_parameters(A_INIT, H)
        self.outputs(opts, nn.Linear(opts.d_model, H * V, bias=False))

    def mix(self, x: torch.Tensor, state: dict | None = None, positions: torch.Tensor | None = None,
            cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, D). ``state`` carries the convolution's last inputs and the delta-rule state (B, H, K, V)."""
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.key_dim, self.value_dim
        q, k, v = self.projected(x, state, positions, [H * K, H * K, H * V])
        a, b = self.decay_beta(x).chunk(2, dim=-1)  # (B, T, H) each
        o = self.recur(gated_delta_rule, F.normalize(q.view(B, T, H, K), dim=-1),
                       F.normalize(k.view(B, T, H, K), dim=-1), v.view(B, T, H, V),
                       -self.A_log.exp() * F.softplus(a + self.dt_bias),  # log α
                       b.sigmoid(),  # β
                       state=state, cu_seqlens=cu_seqlens)
        return self.emit(o, F.silu(self.gate(x).view(B, T, H, V)))

    def flops_per_token(self, T: int) -> float:
        """Training FLOPs per token of the gated delta rule beyond the layer's weights."""
        return chunked_delta_rule_flops(T, self.chunk, self.n_heads, self.key_dim, self.value_dim)
