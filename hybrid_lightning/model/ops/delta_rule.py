"""The gated delta rule of Gated DeltaNet (Yang, Kautz & Hatamizadeh, ICLR 2025, arXiv 2412.06464).

    S_t = exp(g_t) (I - β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ      (state S: K x V per head)
    o_t = scale · S_tᵀ q_t

with L2-normalised keys, β_t in (0, 1) and g_t <= 0. The chunked form is the paper's WY
representation (§3.2; Yang et al. 2024, arXiv 2406.06484): writing the state inside a chunk
as S_i = e^{b_i} S_0 + Σ_{j<=i} e^{b_i-b_j} k_j w_jᵀ, the pseudo-values w solve one unit
lower-triangular system per chunk, (I + A) w = β v - β e^{b} K S_0 with
A_ij = β_i e^{b_i-b_j} k_i·k_j (j < i), solved here by ``torch.linalg.solve_triangular``.
"""

from __future__ import annotations

import torch

from hybrid_lightning.model.ops.common import (
    check_documents,
    chunk_cost,
    chunked_form,
    compute_dtype,
    decay_gradient,
    end_to_end,
    from_chunks,
    kernel_dtype,
    resolve_backend,
    segment_decay,
    to_chunks,
)


def gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, scale: float,
    state: torch.Tensor | None = None, backend: str = "auto", chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule by the implementation ``backend`` selects (see ``ops``).

    Args and returns as ``gated_linear_attention``'s, with q and k L2-normalised by the caller and
        beta: (B, T, H) writing strength in (0, 1).
    """
    backend = resolve_backend(backend, q)
    check_documents(backend, cu_seqlens, state)
    if backend in ("chunked", "compiled"):
        return chunked_form(chunked_delta_rule, backend)(q, k, v, g, beta, scale, state, chunk_size)
    if backend == "fla":
        return fla_delta_rule(q, k, v, g, beta, scale, state, cu_seqlens)
    return recurrent_delta_rule(q, k, v, g, beta, scale, state)


def recurrent_delta_rule(q, k, v, g, beta, scale: float, state: torch.Tensor | None = None):
    """The recurrence itself, one step at a time: the reference the others are tested against. g: (B, T, H), or
    (B, T, H, K) for a decay per key channel (Kimi Delta Attention, ``ops/kda.py``)."""
    dtype = compute_dtype(v)
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    B, T, H, K = k.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if state is None else state.to(dtype)  # (B, H, K, V)
    g = g.reshape(B, T, H, -1, 1)  # (B, T, H, 1 or K, 1): the decay of each row of the state
    out = []
    for t in range(T):
        S = g[:, t].exp() * S
        kt = k[:, t]  # (B, H, K)
        error = v[:, t] - torch.einsum("bhkv,bhk->bhv", S, kt)  # what the state predicts wrongly for k_t
        S = S + beta[:, t, :, None, None] * kt[..., None] * error[..., None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, dim=1).to(v.dtype), S


def chunked_delta_rule(q, k, v, g, beta, scale: float, state: torch.Tensor | None = None, chunk_size: int = 64):
    """Chunks of C steps in the WY form: one batched triangular solve for all chunks, then a loop over
    chunks that carries the state with two small products each, then the outputs of all chunks at once.

    Every exponential is of a difference b_i - b_j <= 0 inside one chunk, so nothing overflows.
    """
    dtype, out_dtype, T = compute_dtype(v), v.dtype, q.shape[1]
    C = min(chunk_size, T)
    with torch.autocast(q.device.type, enabled=False):
        q = q.to(dtype) * scale  # scaled here, where it is cheapest (K <= V in Gated DeltaNet)
        q, k, v = (to_chunks(t.to(dtype), C) for t in (q, k, v))  # (B, H, n, C, K|V)
        b = to_chunks(g.to(dtype), C).cumsum(-1)  # (B, H, n, C): log-decay from chunk start
        beta = to_chunks(beta.to(dtype), C)  # (B, H, n, C)
        k_beta = k * beta[..., None]  # (B, H, n, C, K): β_i k_i
        last = b[..., -1:]  # (B, H, n, 1)
        rhs = torch.cat([v * beta[..., None], k_beta * b.exp()[..., None]], dim=-1)  # (B, H, n, C, V+K)
        kt = k.transpose(-1, -2)
        pseudo_parts, scores = _WYSolve.apply(b, k_beta @ kt, q @ kt, rhs)  # (B, H, n, C, V+K), (B, H, n, C, C)
        # The pseudo-values of a chunk are u - w S_0, S_0 the state entering it.
        u, w = pseudo_parts.split([v.shape[-1], k.shape[-1]], dim=-1)
        k_decayed = (k * (last - b).exp()[..., None]).transpose(-1, -2)  # (B, H, n, K, C)
        S = q.new_zeros(*k.shape[:2], k.shape[-1], v.shape[-1]) if state is None else state.to(dtype)
        before, pseudo = [], []  # per chunk: the state entering it, its pseudo-values
        # unbind, not indexing in the loop: each index's backward would write a full-size gradient.
        for u_c, w_c, k_c, decay_c in zip(*(t.unbind(2) for t in (u, w, k_decayed, last.exp()[..., None]))):
            before.append(S)
            pseudo.append(u_c - w_c @ S)  # (B, H, C, V)
            S = decay_c * S + k_c @ pseudo[-1]
        # o: (B, H, n, C, V)
        o = (q * b.exp()[..., None]) @ torch.stack(before, dim=2) + scores @ torch.stack(pseudo, dim=2)
        return from_chunks(o, T).to(out_dtype), S


class _WYSolve(torch.autograd.Function):
    """(b, K_β Kᵀ, Q Kᵀ, R) -> ((I + A)⁻¹ R, Q Kᵀ ∘ D) with D = segment_decay(b) and A the strict lower
    triangle of K_β Kᵀ ∘ D: the delta rule's unit-triangular solve and its output scores, differentiated
    together by hand, with 6 elementwise passes over the (C, C) blocks backward where autograd makes 12."""

    @staticmethod
    def forward(ctx, b, kk, qk, rhs):
        d = segment_decay(b)
        system, scores = kk * d, qk * d  # the solve reads only the strict lower triangle of system
        x = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        ctx.save_for_backward(d, system, scores, x)
        return x, scores

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_x, grad_scores):
        d, system, scores, x = ctx.saved_tensors
        grad_rhs = torch.linalg.solve_triangular(system.mT, grad_x, upper=True, unitriangular=True)
        grad_system = -grad_rhs @ x.mT  # (B, H, n, C, C): dL/dA, of which the strict lower triangle is real
        grad_system.diagonal(dim1=-2, dim2=-1).zero_()  # the unit diagonal is not A's; d zeroes the upper part
        grad_b = decay_gradient((grad_system, system), (grad_scores, scores))
        return grad_b, grad_system.mul_(d), grad_scores * d, grad_rhs


def chunked_delta_rule_flops(T: int, chunk_size: int, H: int, K: int, V: int) -> float:
    """Training FLOPs per token of ``chunked_delta_rule`` over H heads, counted as ``chunked_gla_flops``
    counts: per token and head, k·k and q·k over the chunk (2·C·K), the unit-triangular solve for V + K
    right-hand sides (C·(V+K)/2), scores times pseudo-values (C·V), and three products with a K x V state
    (the pseudo-values' correction, the state update, the queries against the carried state)."""
    C, padding = chunk_cost(T, chunk_size)
    per_head = 2 * C * K + C * (V + K) / 2 + C * V + 3 * K * V
    return 6 * H * per_head * padding


def fla_delta_rule(q, k, v, g, beta, scale: float, state: torch.Tensor | None = None,
                   cu_seqlens: torch.Tensor | None = None, kernel=None):
    """flash-linear-attention's ``chunk_gated_delta_rule`` Triton kernel (CUDA), or ``kernel``, another of fla's
    with its arguments (``chunk_kda``: g per key channel)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    dtype = kernel_dtype(v)
    B, T = v.shape[:2]
    q, k, v, beta = (t.to(dtype) for t in (q, k, v, beta))
    g = g.float()
    if cu_seqlens is not None:
        q, k, v, g, beta = (end_to_end(t) for t in (q, k, v, g, beta))
    o, S = (kernel or chunk_gated_delta_rule)(
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), scale=scale,
        initial_state=None if state is None else state.float(), output_final_state=True,
        cu_seqlens=None if cu_seqlens is None else cu_seqlens.long(),
    )
    return o.view(B, T, *o.shape[2:]), S
