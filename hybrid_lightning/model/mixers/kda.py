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

from hybrid_lightning.model.mixers.recurrent import DeltaRuleMixer
from hybrid_lightning.model.ops.kda import chunked_kda_flops, kda

if TYPE_CHECKING:
    from hybrid_lightning.kinds import LayerSpec
    from hybrid_lightning.kinds.kda import KDAOptions

A_INIT = (1.0, 16.0)  # fla's KimiDeltaAttention draws A ~ U[1, 16]


def low_rank(d_in: int, rank: int, d_out: int, bias: bool) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, rank, bias=False), nn.Linear(rank, d_out, bias=bias))


class KimiDeltaAttention(DeltaRuleMixer):
    """Args: ``opts`` (``model.kda``, heads resolved: ``n_heads``, ``head_dim``, ``expand_v``, ``conv_size``;
    the backend)."""

    def __init__(self, opts: KDAOptions, spec: LayerSpec):
        super().__init__()
        H, K, V = self.heads(opts)
        self.inputs(opts, H * (2 * K + V))
        self.decay = low_rank(opts.d_model, V, H * K, bias=False)  # W_f↓, W_f↑
        self.beta = nn.Linear(opts.d_model, H, bias=False)
        self.decay_parameters(A_INIT, H * K)
        self.outputs(opts, low_rank(opts.d_model, V, H * V, bias=True))  # W_g↓, W_g↑

    def mix(self, x: torch.Tensor, state: dict | None = None, positions: torch.Tensor | None = None,
            cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, D). ``state`` carries the convolution's last inputs and the delta-rule state (B, H, K, V)."""
        B, T, _ = x.shape
        H, K, V = self.n_heads, self.key_dim, self.value_dim
        q, k, v = self.projected(x, state, positions, [H * K, H * K, H * V])
        log_decay = -self.A_log.exp()[:, None] * F.softplus((self.decay(x) + self.dt_bias).view(B, T, H, K))
        o = self.recur(kda, F.normalize(q.view(B, T, H, K), dim=-1), F.normalize(k.view(B, T, H, K), dim=-1),
                       v.view(B, T, H, V), log_decay, self.beta(x).sigmoid(), state=state, cu_seqlens=cu_seqlens)
        return self.emit(o, self.gate(x).view(B, T, H, V).sigmoid())

    def flops_per_token(self, T: int) -> float:
        """Training FLOPs per token of the per-channel gated delta rule beyond the layer's weights."""
        return chunked_kda_flops(T, self.chunk, self.n_heads, self.key_dim, self.value_dim)
