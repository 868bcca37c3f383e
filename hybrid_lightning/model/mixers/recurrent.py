"""What the recurrent mixers share: how they run packed documents.

A subclass implements ``mix(x, state, positions, cu_seqlens)``; ``forward`` takes the mixer contract's
``doc_ids`` and chooses. On the ``fla`` backend the documents go to fla's kernels in one call
(``cu_seqlens``, each from a zero state) and the short convolution gets each token's position in its
document; the torch backends run each document alone (``documents.by_document``).

Restricted to a receptive field of R tokens (``model/restrict.py``), a mixer computes each position from scratch over
its last R inputs (``restrict.windows``), unless it restricts itself (``mix`` reading ``receptive_field``, as
Lightning Attention does through its decayed state); packed documents then run one by one.
"""

from __future__ import annotations

import abc

import torch
from torch import nn

from hybrid_lightning.model.documents import by_document, cu_seqlens, document_positions
from hybrid_lightning.model.ops import resolve_backend
from hybrid_lightning.model.restrict import windows


class RecurrentMixer(nn.Module, abc.ABC):
    masks_documents = True  # takes doc_ids (Block passes them)
    backend: str  # model.recurrent_backend, set by the subclass
    receptive_field: int | None = None  # the last R inputs only (model/restrict.py); None = the whole history
    restricts_itself = False  # True where ``mix`` honours ``receptive_field`` itself

    def forward(self, x: torch.Tensor, state: dict | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, D) -> (B, T, D); ``doc_ids`` (B, T): packed documents, each run as if alone."""
        if self.receptive_field is not None:
            if doc_ids is not None:
                return by_document(self.forward, x, doc_ids)
            if not self.restricts_itself:
                return windows(self.mix, x, self.receptive_field, state)
        if doc_ids is None:
            return self.mix(x, state)
        if resolve_backend(self.backend, x) != "fla":
            return by_document(self.mix, x, doc_ids)  # each document alone, from a fresh state
        if state is not None:
            raise ValueError("packed documents (doc_ids) with a carried state: a state belongs to one sequence")
        return self.mix(x, None, document_positions(doc_ids), cu_seqlens(doc_ids)[0])

    @abc.abstractmethod
    def mix(self, x: torch.Tensor, state: dict | None = None, positions: torch.Tensor | None = None,
            cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, D) -> (B, T, D). positions (B, T): each token's position in its document (for the short
        convolution); cu_seqlens: the documents of the rows laid end to end, for fla's kernels."""
