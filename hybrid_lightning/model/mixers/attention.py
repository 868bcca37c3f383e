"""Softmax attention as a mixer: full (``F``) or sliding-window (``S``), RoPE or NoPE, GQA, QK-norm."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hybrid_lightning.model.attention import attend
from hybrid_lightning.model.documents import document_positions
from hybrid_lightning.model.rope import Rotary

if TYPE_CHECKING:
    from hybrid_lightning.kinds import AttentionOptions, LayerSpec


class Attention(nn.Module):
    """Args: ``opts`` (heads, key/value heads, head width, QK-norm, RoPE base, kernel); ``spec.window``,
    ``spec.pos``."""

    masks_documents = True  # takes doc_ids itself (Block repacks the documents of mixers without this)

    def __init__(self, opts: AttentionOptions, spec: LayerSpec):
        super().__init__()
        D, self.n_heads, self.n_kv, self.head_dim = opts.d_model, opts.n_heads, opts.kv_heads, opts.head_dim
        self.window = spec.window  # the widest a head sees (None: some head is full): what the KV cache keeps
        self.head_windows = (self.window,) * self.n_heads  # each head's window (heads/retrieval.py, FLOPs)
        self.backend = opts.backend
        self.wq = nn.Linear(D, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(D, self.n_kv * self.head_dim, bias=False)
        self.wv = nn.Linear(D, self.n_kv * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, D, bias=False)
        self.wo.residual_out = True
        self.q_norm = nn.RMSNorm(self.head_dim, eps=opts.norm_eps) if opts.qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=opts.norm_eps) if opts.qk_norm else None
        self.rope = Rotary(self.head_dim, opts.rope_theta) if spec.pos == "rope" else None
        # Head ablations (heads/ablation.py): (H,) multiplier on each head's output, None = all heads on; and (H,)
        # bool, True where the head's query is zeroed, so that its pre-softmax logits are 0 and it attends
        # uniformly over the keys it can see (None = none).
        self.head_mask: torch.Tensor | None = None
        self.uniform_heads: torch.Tensor | None = None
        self.receptive_field: int | None = None  # at most this many keys, the current one included (model/restrict.py)
        self.restricted_heads: frozenset[int] | None = None  # the heads receptive_field limits; None: every head

    def project(
        self, x: torch.Tensor, start: int, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: (B, T, D) at positions start... (or ``positions`` (B, T)) -> q (B, H, T, Dh), k and v (B, Hkv, T, Dh),
        positions applied."""
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q, start, positions), self.rope(k, start, positions)
        return q, k, v

    def forward(self, x: torch.Tensor, state: dict | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, D). ``state`` (a dict, updated in place) carries the KV cache between calls:
        all past keys for full attention, the last W-1 for a window of W. ``doc_ids`` (B, T), with no state:
        no query sees another document's keys, positions count from each document's start."""
        B, T, _ = x.shape
        reach = self.reaches()
        window = None if None in reach else max(reach)  # the keys the cache keeps serve the widest head
        start = state.get("pos", 0) if state is not None else 0
        q, k, v = self.project(x, start, None if doc_ids is None else document_positions(doc_ids))
        if self.uniform_heads is not None:
            q = q.masked_fill(self.uniform_heads.to(q.device).view(1, -1, 1, 1), 0.0)
        if state is not None:
            if "k" in state:
                k, v = torch.cat([state["k"], k], dim=2), torch.cat([state["v"], v], dim=2)
            keep = k.shape[2] if window is None else min(k.shape[2], window - 1)
            state["k"], state["v"] = k[:, :, k.shape[2] - keep :], v[:, :, v.shape[2] - keep :]
            state["pos"] = start + T
        y = self.attend(q, k, v, doc_ids)  # (B, H, T, Dh)
        if self.head_mask is not None:
            y = y * self.head_mask.to(y.dtype).view(1, -1, 1, 1)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_ids: torch.Tensor | None) -> torch.Tensor:
        """q: (B, H, Tq, Dh), k and v: (B, Hkv, Tk, Dh) -> (B, H, Tq, Dh): every head within the layer's window (its
        heads share one: a restriction limits all of them, ``restrict.restricted_layers``)."""
        return attend(q, k, v, window=self.reach(0), backend=self.backend, doc_ids=doc_ids)

    def head_window(self, head: int) -> int | None:
        """The window head ``head`` attends within: the layer's (a head-wise layer's own per head)."""
        return self.window

    def reach(self, head: int) -> int | None:
        """Head ``head``'s window under a receptive-field restriction R (model/restrict.py): at most R keys where it
        limits the head, else the head's own window."""
        window, R = self.head_window(head), self.receptive_field
        if R is None or (self.restricted_heads is not None and head not in self.restricted_heads):
            return window
        return min(window or R, R)

    def reaches(self) -> tuple[int | None, ...]:
        """(H,): each head's ``reach``."""
        return tuple(self.reach(h) for h in range(self.n_heads))
