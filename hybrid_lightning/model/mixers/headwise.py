"""Head-wise hybrid attention (``H``, kinds/headwise.py): one attention layer whose full heads see every earlier key
and whose windowed heads the last W, each group of heads through the one attention dispatch (``attention.attend``,
every backend) on its slice of the heads, the outputs put back in head order. Weights, projections, positions, the
KV cache and head ablations are ``Attention``'s: with every head full it is a full-attention layer, with every head
windowed an SWA layer, output for output."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hybrid_lightning.model.attention import attend
from hybrid_lightning.model.mixers.attention import Attention

if TYPE_CHECKING:
    from hybrid_lightning.kinds import LayerSpec
    from hybrid_lightning.kinds.headwise import HeadwiseOptions

Index = slice | list[int]  # heads as a slice where they are contiguous (a view), else a list (a copy)


def _index(heads: list[int]) -> Index:
    contiguous = heads == list(range(heads[0], heads[0] + len(heads)))
    return slice(heads[0], heads[0] + len(heads)) if contiguous else heads


def head_groups(windows: tuple[int | None, ...], n_kv: int) -> list[tuple[int | None, Index, Index]]:
    """The heads of one layer grouped by window, in order of first appearance: (window, its query heads, the
    key/value heads they read). Where a group holds whole GQA groups it reads those key/value heads once (the
    backends' own GQA); else each query head gets its own copy of its key/value head."""
    rep = len(windows) // n_kv  # query heads per key/value head
    groups = []
    for window in dict.fromkeys(windows):
        heads = [h for h, w in enumerate(windows) if w == window]
        kv = sorted({h // rep for h in heads})
        whole = heads == [g * rep + r for g in kv for r in range(rep)]
        groups.append((window, _index(heads), _index(kv) if whole else [h // rep for h in heads]))
    return groups


def attend_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, windows: tuple[int | None, ...], *,
                 backend: str = "auto", doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``attention.attend`` with head h of q (B, H, Tq, Dh) in its own window ``windows[h]`` (None: full), over k, v
    (B, Hkv, Tk, Dh): one call per group of heads sharing a window (``head_groups``), the outputs (B, H, Tq, Dh) in
    head order."""
    groups = head_groups(windows, k.shape[1])
    if len(groups) == 1:
        return attend(q, k, v, window=windows[0], backend=backend, doc_ids=doc_ids)
    outs = [attend(q[:, heads], k[:, kv], v[:, kv], window=window, backend=backend, doc_ids=doc_ids)
            for window, heads, kv in groups]  # (B, heads of the group, Tq, Dh) each
    y = torch.cat(outs, dim=1)  # (B, H, Tq, Dh), heads in the groups' order
    order = [h for w in dict.fromkeys(windows) for h, hw in enumerate(windows) if hw == w]
    # where that order is not the heads': each head's place in it
    return y if order == sorted(order) else y[:, sorted(range(len(order)), key=order.__getitem__)]


class HeadwiseAttention(Attention):
    """Args: ``opts`` (``Attention``'s and ``heads``, each head's letter), ``spec.window`` (the windowed heads'),
    ``spec.pos``."""

    def __init__(self, opts: HeadwiseOptions, spec: LayerSpec):
        super().__init__(opts, spec)
        self.head_windows = opts.head_windows(spec.window)
        self.window = None if None in self.head_windows else spec.window  # the KV cache keeps all keys for full heads

    def head_window(self, head: int) -> int | None:
        return self.head_windows[head]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_ids: torch.Tensor | None) -> torch.Tensor:
        """q: (B, H, Tq, Dh), k and v: (B, Hkv, Tk, Dh) -> (B, H, Tq, Dh): each head within its own window (narrowed
        by a receptive-field restriction)."""
        return attend_heads(q, k, v, self.reaches(), backend=self.backend, doc_ids=doc_ids)
