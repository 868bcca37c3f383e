"""Packed documents: what a forward needs so that a window of several documents behaves exactly as its
documents run one by one.

``doc_ids`` (B, T) integers mark the documents of each row: equal values are one document, and each
document is contiguous (``data.datamodule.document_ids`` makes them from the end-of-document tokens).
Attention masks keys of other documents, RoPE counts positions from each document's start, and a
mixer without a mask of its own (the recurrent ones) runs on ``by_document``'s repacked batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def document_starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T) bool, True at the first token of each document (every row's first token included)."""
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return starts


def document_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T) long: each token's position within its document (0 at the document's start)."""
    t = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    first = torch.where(document_starts(doc_ids), t, 0).cummax(dim=1).values  # (B, T): start of the token's document
    return t - first


def same_document(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T, T) bool, True where query i and key j lie in one document."""
    return doc_ids[:, :, None] == doc_ids[:, None, :]


def cu_seqlens(doc_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The documents of the B rows laid end to end, as flash-attn's varlen interface takes them:
    (N + 1,) int32 cumulative lengths (0 first, B*T last) and the longest document's length."""
    starts = document_starts(doc_ids).flatten().nonzero().flatten()  # (N,)
    ends = torch.cat([starts, starts.new_tensor([doc_ids.numel()])])
    return ends.to(torch.int32), int((ends[1:] - ends[:-1]).max())


def by_document(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
    """``fn`` (a causal map (N, L, D) -> (N, L, D)) applied to each document alone, exactly.

    The documents of x (B, T, D) are repacked one per row, right-padded with zeros to the longest
    (N, L, D); ``fn`` runs on that batch from position 0 and a fresh state in every row; its outputs
    are gathered back to (B, T, D). Right padding cannot reach a real token through a causal map.
    It costs N x L token slots for B x T tokens."""
    B, T, D = x.shape
    row = document_starts(doc_ids).flatten().cumsum(0) - 1  # (B*T,): the document (output row) of each token
    col = document_positions(doc_ids).flatten()  # (B*T,): its position in that row
    packed = x.new_zeros(int(row[-1]) + 1, int(col.max()) + 1, D)
    packed = packed.index_put((row, col), x.reshape(B * T, D))  # (N, L, D)
    return fn(packed)[row, col].view(B, T, -1)
