"""What the recurrent mixers share: how they run packed documents, and the delta-rule layers' common frame.

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
from hybrid_lightning.model.init import DT_INIT, inverse_softplus_dt
from hybrid_lightning.model.ops import ShortConv, resolve_backend
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


class DeltaRuleMixer(RecurrentMixer):
    """The frame of Gated DeltaNet, KDA and Gated DeltaProduct: ``n_heads`` heads of key width ``head_dim`` and
    value width ``head_dim·expand_v``; q, k, v from one projection through a short convolution; a decay
    parametrised as Mamba-2's (``A_log``, ``dt_bias``); the output RMSNorm(o) · gate, projected. A subclass makes
    its layers in this order (the order of the random draws): ``inputs``, its own, ``decay_parameters``, ``outputs``."""

    def heads(self, opts) -> tuple[int, int, int]:
        """Sets the head geometry and the backend from ``opts``; returns (H, K, V)."""
        self.n_heads, self.key_dim = opts.n_heads, opts.head_dim
        self.value_dim = round(self.key_dim * opts.expand_v)
        self.backend, self.chunk = opts.backend, opts.chunk
        return self.n_heads, self.key_dim, self.value_dim

    def inputs(self, opts, width: int) -> None:
        """The q, k, v projection of ``width`` channels and its short convolution."""
        self.qkv = nn.Linear(opts.d_model, width, bias=False)
        self.conv = ShortConv(width, opts.conv_size, bias=False)

    def decay_parameters(self, a_init: tuple[float, float], dt_size: int) -> None:
        """A_log ~ log U[a_init] per head and Δ_bias over ``dt_size`` channels."""
        self.A_log = nn.Parameter(torch.empty(self.n_heads).uniform_(*a_init).log())
        self.dt_bias = nn.Parameter(inverse_softplus_dt(dt_size, *DT_INIT))

    def outputs(self, opts, gate: nn.Module) -> None:
        """The output gate (to H·V channels), the norm of each head's output, and the output projection."""
        self.gate = gate
        self.out_norm = nn.RMSNorm(self.value_dim, eps=opts.norm_eps)
        self.out_proj = nn.Linear(self.n_heads * self.value_dim, opts.d_model, bias=False)
        self.out_proj.residual_out = True

    def projected(self, x: torch.Tensor, state: dict | None, positions: torch.Tensor | None,
                  sizes: list[int]) -> list[torch.Tensor]:
        """The convolved q, k, v projection of x (B, T, D), split into ``sizes`` channels."""
        return self.conv(self.qkv(x), state, positions).split(sizes, dim=-1)

    def recur(self, op, *args, state: dict | None, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
        """``op(*args)`` at the layer's scale, backend and chunk, from and into ``state["memory"]``: o (B, T, H, V)."""
        o, memory = op(*args, scale=self.key_dim**-0.5, state=None if state is None else state.get("memory"),
                       backend=self.backend, chunk_size=self.chunk, cu_seqlens=cu_seqlens)
        if state is not None:
            state["memory"] = memory
        return o

    def emit(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """o (B, T, H, V) normalised per head, times ``gate`` (B, T, H, V), projected to (B, T, D)."""
        B, T = o.shape[:2]
        return self.out_proj((self.out_norm(o) * gate).reshape(B, T, self.n_heads * self.value_dim))
