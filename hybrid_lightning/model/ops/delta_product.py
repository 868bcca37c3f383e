"""Gated DeltaProduct's operator (Siems et al., *DeltaProduct: Improving State-Tracking in Linear RNNs via
Householder Products*, arXiv 2502.10297): n delta-rule steps per token, each with its own key, value and
writing strength, after the token's one decay.

    S_t = exp(g_t) S_{t-1}, then for j = 1 ... n:  S_t = (I - β_tj k_tj k_tjᵀ) S_t + β_tj k_tj v_tjᵀ
    o_t = scale · S_tᵀ q_t

which is the gated delta rule (``delta_rule``) on the sequence of the T·n sub-steps laid token after
token: the decay at each token's first sub-step, the query at its last, the outputs read there (§3; fla's
``chunk_gated_delta_product_ref`` does the same). The chunked and fla forms run that sequence through the
gated delta rule's; the step-by-step form below is written from the definition.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybrid_lightning.model.ops.common import check_documents, compute_dtype, resolve_backend
from hybrid_lightning.model.ops.delta_rule import chunked_delta_rule_flops, gated_delta_rule


def gated_delta_product(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, scale: float,
    state: torch.Tensor | None = None, backend: str = "auto", chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The operator by the implementation ``backend`` selects (see ``ops``).

    Args:
        q: (B, T, H, K) queries.
        k: (B, T·n, H, K) keys, L2-normalised, the n of token t at t·n ... t·n + n - 1 (fla's layout).
        v: (B, T·n, H, V) values, laid out as the keys.
        g: (B, T, H) log-decay per token, <= 0.
        beta: (B, T·n, H) writing strengths in (0, 1), laid out as the keys.
        scale, state, backend, cu_seqlens: as ``gated_delta_rule``'s.
        chunk_size: sub-steps per chunk of the chunked implementation.

    Returns:
        o (B, T, H, V) in v's dtype and the final state (B, H, K, V), as ``gated_delta_rule``'s.
    """
    backend = resolve_backend(backend, q)
    check_documents(backend, cu_seqlens, state)
    if backend == "recurrent":
        return recurrent_delta_product(q, k, v, g, beta, scale, state)
    B, T, H, K = q.shape
    n = k.shape[1] // T
    q_steps = F.pad(q[:, :, None], (0, 0, 0, 0, n - 1, 0)).flatten(1, 2)  # (B, T·n, H, K): q at the last sub-step
    g_steps = F.pad(g[:, :, None], (0, 0, 0, n - 1)).flatten(1, 2)  # (B, T·n, H): g at the first sub-step
    o, S = gated_delta_rule(q_steps, k, v, g_steps, beta, scale=scale, state=state, backend=backend,
                            chunk_size=chunk_size, cu_seqlens=None if cu_seqlens is None else cu_seqlens * n)
    return o.unflatten(1, (T, n))[:, :, -1], S


def recurrent_delta_product(q, k, v, g, beta, scale: float, state: torch.Tensor | None = None):
    """The recurrence itself, token by token and Householder step by step: the reference the others are
    tested against."""
    dtype = compute_dtype(v)
    B, T, H, K = q.shape
    n = k.shape[1] // T
    q, g = q.to(dtype), g.to(dtype)
    k, v, beta = (t.to(dtype).unflatten(1, (T, n)) for t in (k, v, beta))  # (B, T, n, H, *)
    S = q.new_zeros(B, H, K, v.shape[-1]) if state is None else state.to(dtype)  # (B, H, K, V)
    out = []
    for t in range(T):
        S = g[:, t, :, None, None].exp() * S
        for j in range(n):
            kt = k[:, t, j]  # (B, H, K)
            error = v[:, t, j] - torch.einsum("bhkv,bhk->bhv", S, kt)
            S = S + beta[:, t, j, :, None, None] * kt[..., None] * error[..., None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, dim=1).to(v.dtype), S


def chunked_delta_product_flops(T: int, chunk_size: int, H: int, K: int, V: int, n: int) -> float:
    """Training FLOPs per token of the chunked form: the gated delta rule's over T·n sub-steps, n per token."""
    return n * chunked_delta_rule_flops(T * n, chunk_size, H, K, V)
