"""Windowed causal attention written from its definition, the oracle every attention backend is tested against.

It shares no code with ``hybrid_lightning.model.attention`` (no mask helper, no dispatch): each query's keys are
listed one by one (``visible_keys``) and the query takes a softmax over exactly those. With ``Tq`` queries and
``Tk`` keys, query ``i`` sits at key position ``p = Tk - Tq + i`` and sees key ``j`` iff

    j <= p                                (causal)
    p - W < j          when window W      (W keys: the current one and the W-1 before it)
    doc[j] == doc[p]   when doc_ids       (packed documents: its own document only)

Query head ``h`` of ``H`` reads key/value head ``h // (H // Hkv)`` (grouped-query attention).
"""

from __future__ import annotations

import math

import torch


def visible_keys(p: int, window: int | None, doc: list[int] | None = None) -> list[int]:
    """The key positions a query at key position ``p`` sees, in order; ``doc``: the document id of each position."""
    first = 0 if window is None else max(0, p - window + 1)
    return [j for j in range(first, p + 1) if doc is None or doc[j] == doc[p]]


def key_table(Tq: int, Tk: int, window: int | None, doc: list[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's visible keys as rows of one table: (Tq, n) key positions, padded with key 0 to the longest
    list, and (Tq, n) bool, False at the padding."""
    lists = [visible_keys(Tk - Tq + i, window, doc) for i in range(Tq)]
    n = max(len(keys) for keys in lists)
    positions = torch.tensor([keys + [0] * (n - len(keys)) for keys in lists])
    listed = torch.tensor([[True] * len(keys) + [False] * (n - len(keys)) for keys in lists])
    return positions, listed


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None, doc_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """q: (B, H, Tq, Dh); k, v: (B, Hkv, Tk, Dh), Tq <= Tk; doc_ids: (B, Tk) or None. Returns (B, H, Tq, Dh),
    differentiable in q, k and v, in the inputs' dtype."""
    B, H, Tq, Dh = q.shape
    Tk = k.shape[2]
    heads = torch.arange(H) // (H // k.shape[1])  # (H,): the key/value head each query head reads
    rows = []
    for b in range(B):
        positions, listed = key_table(Tq, Tk, window, None if doc_ids is None else doc_ids[b].tolist())  # (Tq, n)
        kk, vv = k[b][heads][:, positions], v[b][heads][:, positions]  # (H, Tq, n, Dh): each query's own keys
        scores = torch.einsum("hid,hind->hin", q[b], kk) / math.sqrt(Dh)  # (H, Tq, n)
        weights = scores.masked_fill(~listed, float("-inf")).softmax(-1)  # the padding weighs nothing
        rows.append(torch.einsum("hin,hind->hid", weights, vv))  # (H, Tq, Dh)
    return torch.stack(rows)


def naive_headwise_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: list[int | None], doc_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Head-wise attention: query head ``h`` of ``H`` sees the keys of its own window ``windows[h]`` (None: every
    earlier key), in key/value head ``h // (H // Hkv)``, each head on its own through ``naive_attention``.
    q: (B, H, Tq, Dh); k, v: (B, Hkv, Tk, Dh). Returns (B, H, Tq, Dh)."""
    rep = q.shape[1] // k.shape[1]
    heads = [naive_attention(q[:, h : h + 1], k[:, h // rep : h // rep + 1], v[:, h // rep : h // rep + 1], w, doc_ids)
             for h, w in enumerate(windows)]  # (B, 1, Tq, Dh) each
    return torch.cat(heads, dim=1)
