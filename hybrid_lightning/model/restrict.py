"""Receptive-field restriction at inference (the test of Finding 2 in Qiao et al. 2026, arXiv 2606.15378):
the full-attention layers, or the efficient ones, limited to the last R tokens, so that each limited layer's
output at position t depends on its inputs at t-R+1 ... t only.

- Attention (full and sliding-window): a window of min(W, R) keys (R for full attention); exact, no extra cost.
  A head-wise layer's full heads count as full layers and its windowed heads as efficient ones: a restriction
  limits only its own heads.
- Lightning Attention: through its decayed state, exactly (``lightning.py``): o_t = q_t (S_t - γ^R S_{t-R}),
  the second term a second pass of the operator over the keys and values delayed by R tokens; 2x the operator.
- Mamba-2 and Gated DeltaNet (and any other recurrent mixer): each position recomputed from scratch over its last
  R inputs (``windows``), the short convolution included (it sees zeros before the window, as a sequence that
  starts there does); exact, R times the layer's cost for positions beyond R (the first R positions cost one
  ordinary forward).

A restricted model feeds in pieces with its states as an unrestricted one does (``model.new_states()``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import torch
from torch import nn

PARTS = ("full", "efficient")  # which layers a restriction limits: the full-attention ones, or all others
WINDOW_TOKENS = 1 << 16  # tokens of the windows ``windows`` recomputes in one call (bounds its memory)


def restricted_layers(model: nn.Module, part: str) -> dict[int, frozenset[int] | None]:
    """The layers of ``model`` that restricting ``part`` (``PARTS``) limits, each with the heads it limits (None: the
    whole layer). An attention head is ``full`` where it sees every earlier key and ``efficient`` where it has a
    window, so a head-wise layer's heads split between the two; every other mixer is ``efficient``."""
    if part not in PARTS:
        raise ValueError(f"restriction: layers {part!r} is not one of {list(PARTS)}")
    limited = {}
    for i, block in enumerate(model.layers):
        mixer = block.mixer
        if not hasattr(mixer, "head_window"):
            if part == "efficient":
                limited[i] = None
            continue
        heads = frozenset(h for h in range(mixer.n_heads) if (mixer.head_window(h) is None) == (part == "full"))
        if heads:
            limited[i] = None if len(heads) == mixer.n_heads else heads
    return limited


def applicable(model: nn.Module, limits: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The restrictions of ``limits`` ((layers, R) pairs) that limit some layer or head of ``model``; each left out is
    said on stderr, with why (a full-attention model has no efficient layers, an SWA-only one no full layers)."""
    kept = [(part, tokens) for part, tokens in limits if restricted_layers(model, part)]
    for part, tokens in limits:
        if (part, tokens) not in kept:
            print(f"--limit {part}:{tokens} left out: the model has no {part} layers or heads "
                  f"(its mixers: {', '.join(dict.fromkeys(b.spec.mixer for b in model.layers))})", file=sys.stderr)
    return kept


@contextlib.contextmanager
def receptive_field(model: nn.Module, part: str | None, tokens: int | None) -> Iterator[nn.Module]:
    """``model`` (a ``HybridLM``) with the layers (or heads) of ``part`` limited to the last ``tokens`` tokens for the
    block (None: unrestricted); their settings restored after it, an exception included. Every limited mixer must
    take a ``receptive_field`` (attention and the recurrent mixers do); a ``ValueError`` names a layer that does not,
    or says that the model has nothing to limit."""
    if part is None:
        yield model
        return
    if tokens is None or tokens < 1:
        raise ValueError(f"restriction: the receptive field must be a positive number of tokens, not {tokens!r}")
    limited = restricted_layers(model, part)
    if not limited:
        raise ValueError(f"restriction: the model has no {part} layers or heads to limit")
    for i in limited:
        if not hasattr(model.layers[i].mixer, "receptive_field"):
            raise ValueError(f"restriction: layer {i} ({model.layers[i].spec.mixer}) cannot be restricted")
    mixers = {i: model.layers[i].mixer for i in limited}
    old = {i: (m.receptive_field, getattr(m, "restricted_heads", None)) for i, m in mixers.items()}
    try:
        for i, m in mixers.items():
            m.receptive_field = tokens
            if limited[i] is not None:
                m.restricted_heads = limited[i]
        yield model
    finally:
        for i, m in mixers.items():
            m.receptive_field = old[i][0]
            if hasattr(m, "restricted_heads"):
                m.restricted_heads = old[i][1]


def windows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, R: int, state: dict | None) -> torch.Tensor:
    """Each position's output of ``fn`` (a causal map (N, L, D) -> (N, L, D) from a fresh state) recomputed from
    scratch over its last ``R`` inputs: x (B, T, D) -> (B, T, D). ``state`` (a dict, updated in place) carries the
    last R-1 inputs and the count of positions seen, so that pieces fed one after another give one call's outputs.

    Positions below R see their whole history, which one ordinary call over it gives; every later position is
    the last output of ``fn`` on its own window of R inputs (windows batched, ``WINDOW_TOKENS`` at a time)."""
    B, T, D = x.shape
    seen = 0 if state is None else state.get("seen", 0)
    past = None if state is None else state.get("inputs")
    cat = x if past is None else torch.cat([past, x], dim=1)  # (B, P + T, D), P = min(seen, R - 1)
    P = cat.shape[1] - T
    head = max(0, min(T, R - seen))  # current positions below R: from position 0 in ``cat``
    out = [fn(cat[:, : P + head])[:, P:]] if head else []
    if head < T:
        wins = cat[:, P + head - R + 1 :].unfold(1, R, 1).transpose(2, 3)  # (B, T - head, R, D), a view
        per_call = max(1, WINDOW_TOKENS // (R * B))  # windows of each row per call
        for i in range(0, T - head, per_call):
            part = wins[:, i : i + per_call]  # (B, c, R, D)
            out.append(fn(part.reshape(-1, R, D))[:, -1].view(B, part.shape[1], -1))
    if state is not None:
        state["inputs"], state["seen"] = cat[:, max(0, cat.shape[1] - (R - 1)) :], seen + T
    return torch.cat(out, dim=1)
