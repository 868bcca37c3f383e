"""Linear attention with a scalar, data-dependent decay per head and step.

    S_t = exp(g_t) S_{t-1} + k_t v_tᵀ        (state S: K x V per head, g_t <= 0)
    o_t = scale · S_tᵀ q_t

This one operator is Mamba-2's SSD layer (Dao & Gu 2024, arXiv 2405.21060, §6: q = C, k = B,
v = Δ·x, g = Δ·A) and Lightning Attention (Qin et al. 2024, arXiv 2401.04658: g a fixed
per-head constant). The chunked form is the paper's block decomposition (SSD §6, Lightning
Attention-2 §3): inside a chunk, a masked quadratic form; across chunks, the carried state.
flash-linear-attention calls it ``simple_gla``.
"""

from __future__ import annotations

import torch

from hybrid_lightning.model.ops.common import (
    check_documents,
    chunk_cost,
    chunked_form,
    compute_dtype,
    decayed,
    end_to_end,
    from_chunks,
    kernel_dtype,
    resolve_backend,
    to_chunks,
)


def gated_linear_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, *, scale: float,
    state: torch.Tensor | None = None, backend: str = "auto", chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The operator by the implementation ``backend`` selects (see ``ops``).

    Args:
        q, k: (B, T, H, K) queries and keys, or (B, T, 1, K) shared by all heads (Mamba-2's one group
            of B and C), which the chunked path multiplies once rather than once per head.
        v: (B, T, H, V) values.
        g: (B, T, H) log-decay per step, <= 0.
        scale: multiplier on q·k.
        state: (B, H, K, V) state before the first step; None = zeros.
        backend: ``auto``, ``chunked``, ``compiled``, ``recurrent`` or ``fla``.
        chunk_size: steps per chunk of the chunked implementation.
        cu_seqlens: (N + 1,) packed documents of the B rows laid end to end (``documents.cu_seqlens``),
            each from a zero state; fla only.

    Returns:
        o (B, T, H, V) in v's dtype, and the final state (B, H, K, V) in fp32 (fp64 for fp64 input); with
        ``cu_seqlens`` each document's, (N, H, K, V).
    """
    backend = resolve_backend(backend, q)
    check_documents(backend, cu_seqlens, state)
    if backend in ("chunked", "compiled"):
        return chunked_form(chunked_gla, backend)(q, k, v, g, scale, state, chunk_size)
    if backend == "fla":
        return fla_gla(q, k, v, g, scale, state, cu_seqlens)
    return recurrent_gla(q, k, v, g, scale, state)


def recurrent_gla(q, k, v, g, scale: float, state: torch.Tensor | None = None):
    """The recurrence itself, one step at a time: the reference the others are tested against."""
    dtype = compute_dtype(v)
    q, k, v, g = (t.to(dtype) for t in (q, k, v, g))
    B, T, H, K = k.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if state is None else state.to(dtype)  # (B, H, K, V)
    out = []
    for t in range(T):
        S = g[:, t, :, None, None].exp() * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, dim=1).to(v.dtype), S


def chunked_gla(q, k, v, g, scale: float, state: torch.Tensor | None = None, chunk_size: int = 64):
    """Chunks of C steps: o = (masked, decayed q kᵀ) v inside a chunk + decayed q · carried state.

    Every exponential is of a difference b_i - b_j <= 0 of cumulative log-decays inside one chunk,
    so nothing overflows however strong the decay. Cost O(T·C·(K+V) + T·K·V) per head. The decays
    scale the values and the outputs, not the keys and queries: that is cheaper when V <= K (Mamba-2's
    N = 128 against P = 64) and leaves shared keys and queries shared.
    """
    dtype, out_dtype, T = compute_dtype(v), v.dtype, q.shape[1]
    C = min(chunk_size, T)
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = (to_chunks(t.to(dtype), C) for t in (q, k, v))  # (B, H, n, C, K|V)
        b = to_chunks(g.to(dtype), C).cumsum(-1)  # (B, H, n, C): log-decay from chunk start
        last = b[..., -1:]  # (B, H, n, 1): log-decay over the whole chunk
        o = decayed(b, q @ k.transpose(-1, -2)) @ v  # (B, H, n, C, V): within the chunk
        # What each chunk adds to the state, decayed to the chunk's end: (B, H, n, K, V).
        added = k.transpose(-1, -2) @ (v * (last - b).exp()[..., None])
        S = q.new_zeros(*added.shape[:2], *added.shape[3:]) if state is None else state.to(dtype)
        before = []  # the state entering each chunk
        # unbind, not indexing in the loop: each index's backward would write a full-size gradient.
        for chunk_decay, chunk_added in zip(last.exp()[..., None].unbind(2), added.unbind(2)):
            before.append(S)
            S = chunk_decay * S + chunk_added
        o = o + b.exp()[..., None] * (q @ torch.stack(before, dim=2))  # from earlier chunks
        return from_chunks(o if scale == 1 else o * scale, T).to(out_dtype), S  # scale 1 in Mamba-2 and Lightning


def chunked_gla_flops(T: int, chunk_size: int, H: int, K: int, V: int, shared_qk: bool = False) -> float:
    """Training FLOPs per token of ``chunked_gla`` over H heads: its matmuls, forward (2 per multiply-add)
    and backward (twice the forward), on T padded to whole chunks. Per token and head: q·k over the
    chunk's C keys (once for all heads when shared), the chunk's scores times values (C·V), what it
    adds to the state (K·V) and the queries against the carried state (K·V)."""
    C, padding = chunk_cost(T, chunk_size)
    per_head = C * K / (H if shared_qk else 1) + C * V + 2 * K * V
    return 6 * H * per_head * padding


def fla_gla(q, k, v, g, scale: float, state: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None):
    """flash-linear-attention's ``chunk_simple_gla`` Triton kernel (CUDA)."""
    from fla.ops.simple_gla import chunk_simple_gla

    dtype = kernel_dtype(v)
    B, T, H = v.shape[:3]  # shared queries and keys go to the kernel once per head
    q, k, v = (t.to(dtype).expand(B, T, H, t.shape[-1]) for t in (q, k, v))
    g = g.float()
    if cu_seqlens is not None:
        q, k, v, g = (end_to_end(t) for t in (q, k, v, g))
    o, S = chunk_simple_gla(
        q.contiguous(), k.contiguous(), v.contiguous(), g=g.contiguous(), scale=scale,
        initial_state=None if state is None else state.float(), output_final_state=True,
        cu_seqlens=None if cu_seqlens is None else cu_seqlens.long(),
    )
    return o.view(B, T, *o.shape[2:]), S
