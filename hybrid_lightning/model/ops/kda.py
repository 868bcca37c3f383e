"""Kimi Delta Attention's operator (Kimi Team, *Kimi Linear*, arXiv 2510.26692): the gated delta rule with
a decay per key channel instead of one per head.

    S_t = (I - β_t k_t k_tᵀ) Diag(α_t) S_{t-1} + β_t k_t v_tᵀ      (state S: K x V per head, α_t = exp(g_t))
    o_t = scale · S_tᵀ q_t

with L2-normalised keys, β_t in (0, 1) and g_t <= 0 of shape (K,). The chunked form is the paper's (§3.1)
and the gated delta rule's WY form (``delta_rule``) with the decay moved inside the products: writing
b_i for the cumulative log-decay from the chunk's start (one per channel), the pseudo-values u solve
(I + A) u = β v - β (k ⊙ e^{b}) S_0 with A_ij = β_i Σ_d k_id k_jd e^{b_id - b_jd} (j < i), and
o = (q ⊙ e^{b}) S_0 + P u with P_ij = Σ_d q_id k_jd e^{b_id - b_jd} (j <= i). Those decayed products are
computed in sub-chunks (``decayed_products``) so that every exponential is of a difference <= 0.
"""

from __future__ import annotations

import torch

from hybrid_lightning.model.ops.common import (
    check_documents,
    chunk_cost,
    chunked_form,
    compute_dtype,
    from_chunks,
    resolve_backend,
    to_chunks,
)
from hybrid_lightning.model.ops.delta_rule import fla_delta_rule, recurrent_delta_rule

SUB = 8  # steps per sub-chunk: the work inside sub-chunks (C·SUB·K per chunk) and between them (C²·K/SUB) balance


def kda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, scale: float,
    state: torch.Tensor | None = None, backend: str = "auto", chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The operator by the implementation ``backend`` selects (see ``ops``).

    Args and returns as ``gated_delta_rule``'s, with
        g: (B, T, H, K) log-decay per step and key channel, <= 0.
    """
    backend = resolve_backend(backend, q)
    check_documents(backend, cu_seqlens, state)
    if backend in ("chunked", "compiled"):
        return chunked_form(chunked_kda, backend)(q, k, v, g, beta, scale, state, chunk_size)
    if backend == "fla":
        return fla_kda(q, k, v, g, beta, scale, state, cu_seqlens)
    return recurrent_delta_rule(q, k, v, g, beta, scale, state)  # the step-by-step form takes a decay per channel


def decayed_products(x: torch.Tensor, y: torch.Tensor, b: torch.Tensor, strict: bool) -> torch.Tensor:
    """x, y: (..., C, K), b: (..., C, K) cumulative log-decay -> (..., C, C): Σ_d x_id y_jd e^{b_id - b_jd}
    for j < i (``strict``) or j <= i, else 0.

    In sub-chunks of ``SUB`` steps: between sub-chunks, one matmul per query sub-chunk I with the decay split
    at r, the step before I (x_i e^{b_i - b_r} against y_j e^{b_r - b_j}, j <= r < i: both exponents <= 0);
    inside a sub-chunk, the (SUB, SUB, K) products themselves. Nothing overflows however strong the decay.
    """
    C, K = x.shape[-2:]
    c = SUB if C % SUB == 0 else C
    s = C // c
    xs, ys, bs = (t.unflatten(-2, (s, c)) for t in (x, y, b))  # (..., s, c, K)
    # (..., s, K): b at the step before each sub-chunk (0 before the first, whose keys are all masked)
    ref = torch.cat([torch.zeros_like(bs[..., :1, 0, :]), bs[..., :-1, -1, :]], dim=-2)
    after = torch.arange(C, device=x.device) >= torch.arange(s, device=x.device)[:, None] * c  # (s, C): j >= I c
    y_ref = (ref[..., :, None, :] - b[..., None, :, :]).masked_fill(after[..., None], float("-inf")).exp()
    between = (xs * (bs - ref[..., :, None, :]).exp()) @ (y[..., None, :, :] * y_ref).transpose(-1, -2)
    mask = torch.ones(c, c, dtype=torch.bool, device=x.device).triu(1 if not strict else 0)  # (c, c): left out
    inside = (bs[..., :, None, :] - bs[..., None, :, :]).masked_fill(mask[..., None], float("-inf")).exp()
    inside = (xs[..., :, None, :] * ys[..., None, :, :] * inside).sum(-1)  # (..., s, c, c)
    blocks = torch.diag_embed(inside.movedim(-3, -1)).permute(*range(inside.dim() - 3), -2, -4, -1, -3)
    return (between + blocks.flatten(-2, -1)).flatten(-3, -2)  # (..., s, c, C) -> (..., C, C)


def chunked_kda(q, k, v, g, beta, scale: float, state: torch.Tensor | None = None, chunk_size: int = 64):
    """Chunks of C steps in the WY form: one batched triangular solve for all chunks, then a loop over
    chunks that carries the state with two small products each, then the outputs of all chunks at once."""
    dtype, out_dtype, T = compute_dtype(v), v.dtype, q.shape[1]
    C = min(chunk_size, T)
    with torch.autocast(q.device.type, enabled=False):
        q = q.to(dtype) * scale
        q, k, v = (to_chunks(t.to(dtype), C) for t in (q, k, v))  # (B, H, n, C, K|V)
        b = to_chunks(g.to(dtype), C).cumsum(-2)  # (B, H, n, C, K): log-decay from chunk start, per channel
        beta = to_chunks(beta.to(dtype), C)[..., None]  # (B, H, n, C, 1)
        decay = b.exp()
        system = decayed_products(k * beta, k, b, strict=True)  # (B, H, n, C, C): A, zero on the diagonal
        scores = decayed_products(q, k, b, strict=False)  # (B, H, n, C, C)
        rhs = torch.cat([v * beta, k * beta * decay], dim=-1)  # (B, H, n, C, V+K)
        parts = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u, w = parts.split([v.shape[-1], k.shape[-1]], dim=-1)  # pseudo-values u - w S_0
        k_decayed = (k * (b[..., -1:, :] - b).exp()).transpose(-1, -2)  # (B, H, n, K, C)
        S = q.new_zeros(*k.shape[:2], k.shape[-1], v.shape[-1]) if state is None else state.to(dtype)
        before, pseudo = [], []  # per chunk: the state entering it, its pseudo-values
        for u_c, w_c, k_c, decay_c in zip(*(t.unbind(2) for t in (u, w, k_decayed, decay[..., -1, :, None]))):
            before.append(S)
            pseudo.append(u_c - w_c @ S)  # (B, H, C, V)
            S = decay_c * S + k_c @ pseudo[-1]  # decay_c: (B, H, K, 1), one rate per row of the state
        o = (q * decay) @ torch.stack(before, dim=2) + scores @ torch.stack(pseudo, dim=2)  # (B, H, n, C, V)
        return from_chunks(o, T).to(out_dtype), S


def chunked_kda_flops(T: int, chunk_size: int, H: int, K: int, V: int) -> float:
    """Training FLOPs per token of ``chunked_kda`` over H heads, counted as ``chunked_delta_rule_flops``
    counts (its matmuls: the decayed products as one C x K product each, the solve, scores times
    pseudo-values and three products with the K x V state); the elementwise decays are not counted."""
    C, padding = chunk_cost(T, chunk_size)
    per_head = 2 * C * K + C * (V + K) / 2 + C * V + 3 * K * V
    return 6 * H * per_head * padding


def fla_kda(q, k, v, g, beta, scale: float, state: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None):
    """flash-linear-attention's ``chunk_kda`` Triton kernel (CUDA), called as the gated delta rule's."""
    from fla.ops.kda import chunk_kda

    return fla_delta_rule(q, k, v, g, beta, scale, state, cu_seqlens, kernel=chunk_kda)
