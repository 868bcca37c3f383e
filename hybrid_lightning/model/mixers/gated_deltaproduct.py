"""Gated DeltaProduct as a mixer (``P``): Siems, Carstensen, Zela, Hutter, Pontil & Grazzi, *DeltaProduct:
Improving State-Tracking in Linear RNNs via Householder Products*, arXiv 2502.10297 (the layer of fla's
``GatedDeltaProduct``).

Gated DeltaNet's layer (``gated_deltanet``) with n_h keys, values and writing strengths per token: q, k,
v from one projection through a short causal depthwise convolution with SiLU (k and v n_h times as wide);
q and each key L2-normalised; β = σ(W_β x), n_h per head; one decay per token and head,
α = exp(-exp(A_log)·softplus(W_α x + Δ_bias)); n_h delta-rule steps per token; the output
RMSNorm(o) · SiLU(W_g x); an output projection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_lightning.model.mixers.recurrent import DeltaRuleMixer
from hybrid_lightning.model.ops.delta_product import chunked_delta_product_flops, gated_delta_product

if TYPE_CHECKING:
    from hybrid_lightning.kinds import LayerSpec
    from hybrid_lightning.kinds.gated_deltaproduct import GatedDeltaProductOptions

A_INIT = (0.0, 16.0)  # as Gated DeltaNet's: A ~ U[0, 16]


class GatedDeltaProduct(DeltaRuleMixer):
    """Args: ``opts`` (``model.gated_deltaproduct``, heads resolved: ``n_heads``, ``head_dim``, ``expand_v``,
    ``conv_size``, ``householder``; the backend)."""

    def __init__(self, opts: GatedDeltaProductOptions, spec: LayerSpec):
        super().__init__()
        H, K, V = self.heads(opts)
        n = self.steps = opts.householder
        self.inputs(opts, H * (K + n * (K + V)))
        self.decay_beta = nn.Linear(opts.d_model, H * (1 + n), bias=False)  # W_α and the n W_β
        self.decay_parameters(A_INIT, H)
        self.outputs(opts, nn.Linear(opts.d_model, H * V, bias=False))

    def mix(self, x: torch.Tensor, state: dict | None = None, positions: torch.Tensor | None = None,
            cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, D). ``state`` carries the convolution's last inputs and the delta-rule state (B, H, K, V)."""
        B, T, _ = x.shape
        H, K, V, n = self.n_heads, self.key_dim, self.value_dim, self.steps
        q, k, v = self.projected(x, state, positions, [H * K, n * H * K, n * H * V])
        a, b = self.decay_beta(x).split([H, n * H], dim=-1)  # (B, T, H), (B, T, n·H)
        o = self.recur(gated_delta_product, F.normalize(q.view(B, T, H, K), dim=-1),
                       F.normalize(k.reshape(B, T * n, H, K), dim=-1),  # (B, T·n, H, K): token t's n keys in a row
                       v.reshape(B, T * n, H, V),
                       -self.A_log.exp() * F.softplus(a + self.dt_bias),  # log α, one per token
                       b.sigmoid().reshape(B, T * n, H),  # β, n per token
                       state=state, cu_seqlens=cu_seqlens)
        return self.emit(o, F.silu(self.gate(x).view(B, T, H, V)))

    def flops_per_token(self, T: int) -> float:
        """Training FLOPs per token of the n_h delta-rule steps per token beyond the layer's weights."""
        return chunked_delta_product_flops(T, self.chunk, self.n_heads, self.key_dim, self.value_dim, self.steps)
