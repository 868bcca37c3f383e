"""The one attention dispatch: causal attention with an optional sliding window.

Window semantics, the same in every backend: a query at position t sees the key
positions t-W+1 ... t (W tokens, the current one included), i.e. flash-attn's
``window_size=(W-1, 0)`` with ``causal=True``. ``window=None`` is full causal attention.

Queries are aligned to the end of the keys (so a KV cache of past keys may precede
them): with ``Tq`` queries and ``Tk >= Tq`` keys, query ``i`` sits at key position
``Tk - Tq + i``.

Backends:
- ``reference``: explicit scores and a (Tq, Tk) mask; the ground truth the others are tested against.
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``; causal without a mask when it can,
  else a dense (Tq, Tk) mask (fine for short sequences, slow and memory-hungry for long windowed ones).
- ``blocked``: sliding-window attention in blocks of S >= W-1 queries, each attending to its own and
  the previous key block: O(T * S) time and memory, never a T x T mask.
- ``auto``: full attention (or a window covering every key) -> ``sdpa``; a sliding window -> ``blocked``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "reference", "sdpa", "blocked")
MIN_BLOCK = 16  # smallest query block of the blocked backend; tiny windows still get useful matmuls


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int | None, backend: str = "auto"
) -> torch.Tensor:
    """q: (B, H, Tq, Dh); k, v: (B, Hkv, Tk, Dh), Hkv dividing H, Tq <= Tk. Returns (B, H, Tq, Dh)."""
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r} is not one of {list(BACKENDS)}")
    Tq, Tk = q.shape[2], k.shape[2]
    assert Tq <= Tk, (Tq, Tk)
    if window is not None and window >= Tk:
        window = None  # the window covers every key: full causal attention
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if backend == "auto":
        backend = "sdpa" if window is None else "blocked"
    if backend == "reference":
        return reference_attention(q, k, v, window)
    if backend == "blocked" and window is not None:
        return blocked_attention(q, k, v, window)
    if window is None and Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(Tq, Tk, window, q.device))


def causal_mask(Tq: int, Tk: int, window: int | None, device: torch.device | None = None) -> torch.Tensor:
    """(Tq, Tk) boolean mask, True where query i (at key position Tk-Tq+i) may see key j."""
    qpos = torch.arange(Tk - Tq, Tk, device=device)[:, None]
    kpos = torch.arange(Tk, device=device)[None, :]
    allowed = kpos <= qpos
    if window is not None:
        allowed &= qpos - kpos < window
    return allowed


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> torch.Tensor:
    """Plain softmax attention over explicit scores; q, k, v: (B, H, T*, Dh) with equal heads."""
    dtype = torch.promote_types(q.dtype, torch.float32)  # at least fp32 scores and softmax
    scores = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], window, q.device), float("-inf"))
    return (scores.softmax(dim=-1) @ v.to(dtype)).to(q.dtype)


def blocked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Sliding-window attention in blocks; q, k, v: (B, H, T*, Dh) with equal heads.

    Query block i covers positions [iS, iS+S) and needs keys [iS-W+1, iS+S), which lie in key
    blocks i-1 and i because S >= W-1. Each block is one batched SDPA call with a (S, 2S) band mask.
    """
    B, H, Tq, Dh = q.shape
    # Only the last W-1 keys before the first query matter; drop older ones.
    past = min(k.shape[2] - Tq, window - 1)
    k, v = k[:, :, k.shape[2] - Tq - past :], v[:, :, v.shape[2] - Tq - past :]
    T = k.shape[2]
    S = max(window - 1, MIN_BLOCK)
    n = -(-T // S)
    # Queries padded in front to line up with the keys, then everything padded to n*S.
    q = F.pad(q, (0, 0, past, n * S - T))  # (B, H, nS, Dh)
    k = F.pad(k, (0, 0, S, n * S - T))  # (B, H, (n+1)S, Dh): one zero block in front
    v = F.pad(v, (0, 0, S, n * S - T))
    qb = q.view(B, H, n, S, Dh)
    kb = k.unfold(2, 2 * S, S).transpose(-1, -2)  # (B, H, n, 2S, Dh): blocks i-1 and i
    vb = v.unfold(2, 2 * S, S).transpose(-1, -2)
    r = torch.arange(S, device=q.device)[:, None]  # query offset in its block
    c = torch.arange(2 * S, device=q.device)[None, :]  # key offset from the start of block i-1
    band = (c - S <= r) & (r - (c - S) < window)  # (S, 2S)
    mask = band.expand(n, S, 2 * S).clone()
    mask[0, :, :S] = False  # block -1 is padding
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)  # (B, H, n, S, Dh)
    return out.reshape(B, H, n * S, Dh)[:, :, past : past + Tq]
