"""The haystacks of the probes (tasks.py), built from whole units and filled to an exact token count:
text tokenized piece by piece with labelled spans (``Piece``), sentences, the noise block and the
held-out essay text as units, and the assembly of head + haystack + inserts at their depths + tail."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator

import numpy as np

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*\s+|\n[ \t]*\n\s*")  # a sentence's end, its trailing whitespace included
LONG_SENTENCE = 256  # characters: longer pieces without a sentence end are cut at line ends
MAX_SKIPS = 64  # haystack units tried after one whose first sentence overruns the budget


class Piece:
    """Token ids of a text built piece by piece; labelled pieces remember their span."""

    def __init__(self, tok, parts: list[str | tuple[str, str]]):
        ids, self.spans = [], {}
        n = 0
        for part in parts:
            text, label = part if isinstance(part, tuple) else (part, None)
            t = tok.encode(text)
            if label is not None:
                self.spans[label] = (n, n + len(t))
            ids.append(t)
            n += len(t)
        self.ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)


def sentences(text: str) -> list[str]:
    """``text`` cut after every sentence end (and paragraph break), each piece keeping its trailing
    whitespace; the last piece is what follows the last end (possibly an unfinished sentence). Text
    with no sentence end for ``LONG_SENTENCE`` characters (source code, tables) is cut at its line ends."""
    ends = [m.end() for m in SENTENCE_END.finditer(text)]
    pieces = [text[a:b] for a, b in zip([0, *ends], [*ends, len(text)]) if b > a]
    return [line for p in pieces for line in (p.splitlines(keepends=True) if len(p) > LONG_SENTENCE else [p])]


def pad_tokens(tok) -> dict[bool, np.ndarray]:
    """The single tokens that pad a haystack to its exact budget: {ends with a newline: a newline
    token (a blank line), otherwise: a space}; a space everywhere when a newline is not one token."""
    space, newline = tok.encode(" "), tok.encode("\n")
    if len(space) != 1:
        raise ValueError("data.tokenizer: ' ' is not a single token; probes cannot be filled to an exact length")
    return {False: space, True: newline if len(newline) == 1 else space}


def fill(tok, units: Iterable[list[np.ndarray]], budget: int) -> list[np.ndarray]:
    """Whole units (each a list of tokenized sentences), in order, totalling exactly ``budget`` tokens.
    The first unit that overruns the budget is cut after its last sentence that fits and ends the
    haystack; a unit whose first sentence alone overruns it is skipped for the next ones (at most
    ``MAX_SKIPS``). The tokens still missing are pad tokens appended to the units, spread evenly."""
    hay, n, skips = [], 0, 0
    for unit in units:
        lengths = np.cumsum([len(x) for x in unit])
        fit = int((lengths <= budget - n).sum())
        if fit:
            hay.append(np.concatenate(unit[:fit]))
            n += int(lengths[fit - 1])
        if 0 < fit < len(unit) or n == budget:
            break
        skips += not fit
        if skips > MAX_SKIPS:
            break
    pads, missing = pad_tokens(tok), budget - n
    if not hay:
        return [np.repeat(pads[False], missing)]
    extra = np.full(len(hay), missing // len(hay))
    extra[np.linspace(0, len(hay) - 1, missing % len(hay)).round().astype(int)] += 1
    return [np.concatenate([u, np.repeat(pads[tok.decode(u[-1:]).endswith("\n")], k)]) for u, k in zip(hay, extra)]


def assemble(head: Piece, hay: list[np.ndarray], inserts: list[tuple[float, Piece]],
              tail: Piece) -> tuple[np.ndarray, list[dict]]:
    """head + haystack units with each insert at the unit boundary nearest its depth + tail; returns
    the tokens and each insert's spans (in absolute positions, key "_" for the whole insert) in the
    order of ``inserts`` (which also orders inserts at the same boundary), then {"haystack": its span}."""
    bounds = np.cumsum([0] + [len(u) for u in hay])  # token offset of each unit boundary
    out, placed, pos, k0 = [head.ids], [{} for _ in inserts], len(head.ids), 0
    for i in sorted(range(len(inserts)), key=lambda i: inserts[i][0]):  # stable: equal depths keep their order
        d, piece = inserts[i]
        k = max(k0, int(np.abs(bounds - d * bounds[-1]).argmin()))
        out += hay[k0:k]
        pos += int(bounds[k] - bounds[k0])
        out.append(piece.ids)
        placed[i] = ({lab: (s + pos, e + pos) for lab, (s, e) in piece.spans.items()}
                     | {"_": (pos, pos + len(piece.ids))})
        pos += len(piece.ids)
        k0 = k
    out += hay[k0:] + [tail.ids]
    ids = np.concatenate(out).astype(np.int64)
    placed.append({"haystack": (len(head.ids), len(ids) - len(tail.ids))})
    return ids, placed


def count(hay: np.ndarray, needle: np.ndarray) -> int:
    if len(needle) > len(hay):
        return 0
    windows = np.lib.stride_tricks.sliding_window_view(hay, len(needle))
    return int((windows == needle).all(axis=1).sum())


def noise_units(tok, end: str) -> Iterator[list[np.ndarray]]:
    """The noise block (as its tokenized sentences) endlessly, its last sentence ending with ``end``."""
    return itertools.repeat([tok.encode(s) for s in sentences(NOISE + end)])


def essay_units(ctx, rng: np.random.Generator, budget: int) -> list[list[np.ndarray]]:
    """Whole sentences of held-out text from a random offset (wrapping around), one unit each,
    re-tokenized one by one: the text read from there is cut into sentences and the first and last,
    which may be cut off, are dropped; the stretch read doubles until its sentences exceed the budget."""
    if ctx.essay is None or len(ctx.essay) < 2:
        raise ValueError("essay haystacks need held-out text (the run's validation split)")
    pos, span = int(rng.integers(len(ctx.essay))), 4 * budget + 256
    while True:
        block = np.take(ctx.essay, np.arange(pos, pos + span), mode="wrap")
        units = [[ctx.tok.encode(s)] for s in sentences(ctx.tok.decode(block))[1:-1]]
        if sum(len(u[0]) for u in units) > budget or span > 8 * (len(ctx.essay) + budget):
            return units
        span *= 2
