"""Long-context probe generators: passkey retrieval and RULER's needle-in-a-haystack family.

- ``passkey``: Mohtashami & Jaggi 2023 (arXiv 2305.16300): repeated filler sentences, "The pass
  key is {k}. Remember it. {k} is the pass key.", the question at the end; k in 1..50000.
- ``niah_*`` and ``vt``: RULER (Hsieh et al. 2024, arXiv 2404.06654, NVIDIA/RULER): needles "One of
  the special magic {type} for {key} is: {value}." in a noise haystack (a repeated sentence block),
  an essay haystack (held-out real text of the run's corpus) or a haystack of distractor needles;
  keys are adjective-noun words (wonderwords' lists, as RULER) or UUIDs, values 7-digit numbers,
  words or UUIDs. ``vt`` is variable tracking: one chain ``VAR A = 12345``, ``VAR B = VAR A``, ...
  (4 hops) in noise; the answer names every variable of the chain (no in-context example).

Every sample is exactly ``length`` tokens (prompt + answer): the haystack is cut to the token
budget left by the fixed text. Needles sit at the haystack-unit boundary (a noise block, a line
of essay text, a distractor needle) nearest ``depth`` x haystack tokens; the needles of a
multi-needle task stand together there (as RULER's controllable-depth variant). Text is tokenized
piece by piece (instruction, each key, each value, ...) and the pieces concatenated, so a value
has the same tokens in its needle and in the answer whatever the tokenizer.

Answers with several values list them as " v1, v2, ..." (per queried key in query order, each
key's values in context order); ``vt`` lists the variables in chain order separated by spaces.
"""

from __future__ import annotations

import functools
import itertools
import math
import uuid
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_HEAD = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
                "I will quiz you about the important information there.\n")
PASSKEY_RANGE = (1, 50000)
NUMBER_DIGITS = 7  # RULER's numbers
VT_HOPS, VT_VAR_LETTERS = 4, 5  # RULER's defaults: one chain of 4 hops, 5-letter variable names
VT_VALUE_RANGE = (10000, 99999)
MAX_REDRAWS = 100
MAX_UNITS = 256  # how far long_value lengthens a value before giving up


@dataclass(frozen=True)
class Sample:
    """One probe. ``prompt`` ends with the answer prefix; ``len(prompt) + len(answer) == length``.

    ``haystack_span``: [start, end) of the haystack, needles included, between the instruction and
    the question; ``needle_spans``: [start, end) of every needle statement; ``value_spans``: the
    span of each value the answer copies, in answer order; ``answer_source[j]``: the prompt
    position holding answer token j (-1 for separators), so ``prompt[answer_source[j]] ==
    answer[j]`` wherever it is >= 0. ``chance_nll``: -log P(answer) under the value prior (nats),
    i.e. what a model that knows the answer's format but retrieves nothing pays for it.
    """

    task: str
    length: int
    depth: float
    prompt: np.ndarray
    answer: np.ndarray
    needle_spans: tuple[tuple[int, int], ...]
    value_spans: tuple[tuple[int, int], ...]
    answer_source: np.ndarray
    chance_nll: float
    haystack_span: tuple[int, int]

    @property
    def needle_pos(self) -> int:
        return min(s for s, _ in self.needle_spans)

    def distance(self) -> int:
        """Tokens from the first value the answer copies to the position that predicts its first token."""
        return len(self.prompt) - 1 - self.value_spans[0][0]

    def in_window(self, window: int) -> bool:
        """Whether every answer token's source lies within ``window`` tokens (current one included)
        of the position that predicts it: a sliding-window layer of that window can see it."""
        pred = len(self.prompt) - 1 + np.arange(len(self.answer))
        has = self.answer_source >= 0
        return bool((pred[has] - self.answer_source[has] < window).all())


# ---- pieces -> tokens ---------------------------------------------------------------------------


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


def _assemble(head: Piece, units: Iterable[np.ndarray], budget: int, depth: float, inserts: list[tuple[float, Piece]],
              tail: Piece) -> tuple[np.ndarray, list[dict]]:
    """head + haystack cut to exactly ``budget`` tokens with each insert at the unit boundary nearest
    its depth + tail; returns the tokens and each insert's spans (in absolute positions, key "_" for
    the whole insert) in the order of ``inserts``, then {"haystack": its span}."""
    hay, n = [], 0
    for u in units:
        if n >= budget:
            break
        hay.append(u[: budget - n])
        n += len(hay[-1])
    bounds = np.cumsum([0] + [len(u) for u in hay])  # token offset of each unit boundary
    out, placed, pos, k0 = [head.ids], [{} for _ in inserts], len(head.ids), 0
    for i in sorted(range(len(inserts)), key=lambda i: inserts[i][0]):  # stable: equal depths keep their order
        d, piece = inserts[i]
        k = max(k0, int(np.abs(bounds - d * budget).argmin()))
        out += hay[k0:k]
        pos += int(bounds[k] - bounds[k0])
        out.append(piece.ids)
        placed[i] = {lab: (s + pos, e + pos) for lab, (s, e) in piece.spans.items()} | {"_": (pos, pos + len(piece.ids))}
        pos += len(piece.ids)
        k0 = k
    out += hay[k0:] + [tail.ids]
    ids = np.concatenate(out).astype(np.int64)
    placed.append({"haystack": (len(head.ids), len(ids) - len(tail.ids))})
    return ids, placed


def _count(hay: np.ndarray, needle: np.ndarray) -> int:
    if len(needle) > len(hay):
        return 0
    windows = np.lib.stride_tricks.sliding_window_view(hay, len(needle))
    return int((windows == needle).all(axis=1).sum())


# ---- values ---------------------------------------------------------------------------------------


@functools.cache
def word_lists() -> tuple[list[str], list[str]]:
    """(adjectives, nouns) of wonderwords, the lists RULER draws its adjective-noun keys from."""
    from wonderwords import RandomWord

    rw = RandomWord(enhanced_prefixes=False)
    return rw.filter(include_categories=["adjective"]), rw.filter(include_categories=["noun"])


def draw_value(kind: str, rng: np.random.Generator, units: int) -> tuple[str, float]:
    """A random value of ``kind`` made of ``units`` parts and the log of how many values it is drawn
    from uniformly: numbers (``units`` digits), words (``units`` adjective-noun pairs joined by '-'),
    uuids (``units`` version-4 UUIDs joined by '-')."""
    if kind == "numbers":  # uniform over the 9 * 10^(units-1) numbers of ``units`` digits
        digits = [int(rng.integers(1, 10))] + rng.integers(0, 10, units - 1).tolist()
        return "".join(map(str, digits)), math.log(9) + (units - 1) * math.log(10)
    if kind == "words":
        adjs, nouns = word_lists()
        pairs = [f"{adjs[rng.integers(len(adjs))]}-{nouns[rng.integers(len(nouns))]}" for _ in range(units)]
        return "-".join(pairs), units * math.log(len(adjs) * len(nouns))
    if kind == "uuids":
        ids = [str(uuid.UUID(bytes=rng.bytes(16), version=4)) for _ in range(units)]
        return "-".join(ids), units * 122 * math.log(2)  # 6 of 128 bits are fixed by version 4
    raise ValueError(f"unknown value kind {kind!r}")


def long_value(kind: str, rng: np.random.Generator, tok, min_tokens: int | None, units: int = 1) -> tuple[str, float]:
    """``draw_value`` lengthened (more units) until " value" takes at least ``min_tokens`` tokens."""
    for units in range(units, units + MAX_UNITS):
        text, log_n = draw_value(kind, rng, units)
        if min_tokens is None or len(tok.encode(" " + text)) >= min_tokens:
            return text, log_n
    raise ValueError(f"eval.value_tokens: {kind} values do not reach {min_tokens} tokens with this tokenizer")


# ---- tasks --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenContext:
    """What generators need besides the random state: the tokenizer, held-out real text for essay
    haystacks, and an optional minimum value length in tokens (long answers for head probing)."""

    tok: object
    essay: np.ndarray | None = None
    value_tokens: int | None = None


def _essay_units(ctx: GenContext, rng: np.random.Generator, budget: int) -> list[np.ndarray]:
    """Lines of held-out text from a random offset (wrapping around), re-tokenized line by line."""
    if ctx.essay is None or len(ctx.essay) < 2:
        raise ValueError("essay haystacks need held-out text (the run's validation split)")
    units, n, pos = [], 0, int(rng.integers(len(ctx.essay)))
    while n < budget:
        block = np.take(ctx.essay, np.arange(pos, pos + 4 * budget + 64), mode="wrap")
        pos += len(block)
        for line in ctx.tok.decode(block).splitlines(keepends=True):
            units.append(ctx.tok.encode(line))
            n += len(units[-1])
    return units


@dataclass(frozen=True)
class Niah:
    """A RULER needle-in-a-haystack task (one row of RULER's task table)."""

    haystack: str  # noise | essay | needles
    key: str  # words | uuids
    value: str  # numbers | words | uuids
    keys: int = 1
    values: int = 1
    queries: int = 1

    def draw(self, ctx: GenContext, rng: np.random.Generator, length: int, depth: float, task: str) -> Sample:
        tok, single = ctx.tok, self.values * self.queries == 1
        plural, kind = self.value, self.value[:-1]
        keys = _distinct(lambda: long_value(self.key, rng, tok, None)[0], self.keys)
        facts = [(k, long_value(self.value, rng, tok, ctx.value_tokens, _units(self.value))) for k in keys for _ in range(self.values)]
        order = rng.permutation(len(facts))  # needles in shuffled order
        queried = [keys[i] for i in rng.permutation(self.keys)[: self.queries]]
        needles = [Piece(tok, ["One of the special magic " + plural + " for", (" " + facts[i][0], "key"), " is:",
                               (" " + facts[i][1][0], "value"), ".\n"]) for i in order]
        answer_of = [(q, j) for q in queried for j, i in enumerate(order) if facts[i][0] == q]
        query = ", ".join(queried[:-1]) + ", and " + queried[-1] if len(queried) > 1 else queried[0]
        t = kind if single else plural
        head = Piece(tok, [f"{'A' if single else 'Some'} special magic {t} {'is' if single else 'are'} hidden within the "
                           f"following text. Make sure to memorize it. I will quiz you about the {t} afterwards.\n"])
        tail = Piece(tok, [f"\nWhat {'is' if single else 'are all'} the special magic {t} for", " " + query,
                           f" mentioned in the provided text? The special magic {t} for", " " + query,
                           f" mentioned in the provided text {'is' if single else 'are'}"])
        values = [facts[order[j]][1] for _, j in answer_of]
        answer = Piece(tok, [part for n, (v, _) in enumerate(values) for part in ([","] if n else []) + [(" " + v, f"a{n}")]])
        budget = _budget(length, task, head, tail, answer, needles)
        if self.haystack == "noise":
            units = itertools.repeat(tok.encode(NOISE + "\n"))
        elif self.haystack == "essay":
            units = _essay_units(ctx, rng, budget)
        else:
            units = self._distractors(ctx, rng, keys)
        prompt, placed = _assemble(head, units, budget, depth, [(depth, p) for p in needles], tail)
        value_spans = [placed[j]["value"] for _, j in answer_of]
        return _sample(task, length, depth, prompt, answer, placed, value_spans, sum(log_n for _, log_n in values))

    def _distractors(self, ctx: GenContext, rng: np.random.Generator, keys: list[str]) -> Iterator[np.ndarray]:
        """Endless needles with fresh keys (none of ``keys``) and values, drawn as the haystack consumes them."""
        while True:
            k = long_value(self.key, rng, ctx.tok, None)[0]
            if k in keys:
                continue
            v = long_value(self.value, rng, ctx.tok, ctx.value_tokens, _units(self.value))[0]
            yield ctx.tok.encode(f"One of the special magic {self.value} for {k} is: {v}.\n")


def _units(kind: str) -> int:
    return NUMBER_DIGITS if kind == "numbers" else 1


def _distinct(draw, n: int) -> list:
    out: list = []
    while len(out) < n:
        v = draw()
        if v not in out:
            out.append(v)
    return out


def _budget(length: int, task: str, *pieces) -> int:
    fixed = sum(len(p.ids) for group in pieces for p in (group if isinstance(group, list) else [group]))
    if fixed > length:
        raise ValueError(f"eval.lengths: {length} tokens is too short for task {task!r}: its text without haystack "
                         f"takes {fixed} tokens with this tokenizer")
    return length - fixed


def _sample(task, length, depth, prompt, answer: Piece, placed, value_spans, chance_nll) -> Sample:
    source = np.full(len(answer.ids), -1, np.int64)
    for n, (s, e) in enumerate(value_spans):
        a0, a1 = answer.spans[f"a{n}"]
        assert e - s == a1 - a0
        source[a0:a1] = np.arange(s, e)
    sample = Sample(task=task, length=length, depth=depth, prompt=prompt, answer=answer.ids,
                    needle_spans=tuple(p["_"] for p in placed[:-1]), value_spans=tuple(value_spans),
                    answer_source=source, chance_nll=chance_nll, haystack_span=placed[-1]["haystack"])
    assert len(sample.prompt) + len(sample.answer) == length and (prompt[source[source >= 0]] == answer.ids[source >= 0]).all()
    return sample


@dataclass(frozen=True)
class Passkey:
    """Pass-key retrieval (Mohtashami & Jaggi 2023)."""

    def draw(self, ctx: GenContext, rng: np.random.Generator, length: int, depth: float, task: str) -> Sample:
        tok = ctx.tok
        if ctx.value_tokens is None:
            lo, hi = PASSKEY_RANGE
            key, log_n = str(int(rng.integers(lo, hi + 1))), math.log(hi - lo + 1)
        else:
            key, log_n = long_value("numbers", rng, tok, ctx.value_tokens, units=len(str(PASSKEY_RANGE[1])))
        needle = Piece(tok, ["\nThe pass key is", (" " + key, "value"), ". Remember it.", " " + key, " is the pass key.\n"])
        head, tail = Piece(tok, [PASSKEY_HEAD]), Piece(tok, ["\nWhat is the pass key? The pass key is"])
        answer = Piece(tok, [(" " + key, "a0")])
        budget = _budget(length, task, head, tail, answer, needle)
        prompt, placed = _assemble(head, itertools.repeat(tok.encode(NOISE + " ")), budget, depth, [(depth, needle)], tail)
        return _sample(task, length, depth, prompt, answer, placed, [placed[0]["value"]], log_n)


@dataclass(frozen=True)
class VariableTracking:
    """RULER's variable tracking: one chain of ``VT_HOPS`` hops in noise, its first statement (the
    value) at ``depth`` and the others at random boundaries after it."""

    def draw(self, ctx: GenContext, rng: np.random.Generator, length: int, depth: float, task: str) -> Sample:
        tok = ctx.tok
        names = _distinct(lambda: "".join(chr(65 + c) for c in rng.integers(0, 26, VT_VAR_LETTERS)), VT_HOPS + 1)
        value = str(int(rng.integers(VT_VALUE_RANGE[0], VT_VALUE_RANGE[1] + 1)))
        chain = [Piece(tok, ["VAR", (" " + names[0], "var"), " = " + value + "\n"])]
        chain += [Piece(tok, ["VAR", (" " + b, "var"), " = VAR", " " + a, "\n"]) for a, b in zip(names, names[1:])]
        head = Piece(tok, ["Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"])
        tail = Piece(tok, [f"\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: "
                           "According to the chain(s) of variable assignment in the text above, "  # RULER's spelling:
                           f"{len(names)} variables are assgined the value {value}, they are:"])
        answer = Piece(tok, [(" " + name, f"a{n}") for n, name in enumerate(names)])
        budget = _budget(length, task, head, tail, answer, chain)
        depths = [depth] + sorted(rng.uniform(depth, 1.0, VT_HOPS).tolist())
        prompt, placed = _assemble(head, itertools.repeat(tok.encode(NOISE + "\n")), budget, depth, list(zip(depths, chain)), tail)
        chance = len(names) * VT_VAR_LETTERS * math.log(26)
        return _sample(task, length, depth, prompt, answer, placed, [p["var"] for p in placed[:-1]], chance)


# RULER's retrieval tasks (its table of niah variants) plus passkey and variable tracking.
TASKS: dict[str, Passkey | Niah | VariableTracking] = {
    "passkey": Passkey(),
    "niah_single_1": Niah("noise", "words", "numbers"),
    "niah_single_2": Niah("essay", "words", "numbers"),
    "niah_single_3": Niah("essay", "words", "uuids"),
    "niah_multikey_1": Niah("essay", "words", "numbers", keys=4),
    "niah_multikey_2": Niah("needles", "words", "numbers"),
    "niah_multikey_3": Niah("needles", "uuids", "uuids"),
    "niah_multivalue": Niah("essay", "words", "numbers", values=4),
    "niah_multiquery": Niah("essay", "words", "numbers", keys=4, queries=4),
    "vt": VariableTracking(),
}


def check_tasks(tasks: Iterable[str], field: str = "eval.tasks") -> None:
    """A ``ValueError`` naming ``field`` for a task name that is not in ``TASKS``."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"{field}: {unknown} not among the accepted tasks {sorted(TASKS)}")


def answer_is_unique(s: Sample) -> bool:
    """Every value the answer copies occurs in the prompt only inside the needles."""
    for a, b in s.value_spans:
        v = s.prompt[a:b]
        if _count(s.prompt, v) != sum(_count(s.prompt[x:y], v) for x, y in s.needle_spans):
            return False
    return True


def make_sample(task: str, ctx: GenContext, length: int, depth: float, index: int, seed: int = 0) -> Sample:
    """Sample ``index`` of ``task`` at ``length`` tokens and needle ``depth``: a pure function of its
    arguments (and the tokenizer and essay text). Draws again while a value occurs outside its needle."""
    rng = np.random.default_rng([seed, zlib.crc32(task.encode()), length, round(depth * 1e6), index])
    for _ in range(MAX_REDRAWS):
        sample = TASKS[task].draw(ctx, rng, length, depth, task)
        if answer_is_unique(sample):
            return sample
    raise RuntimeError(f"{task}: no sample with a unique answer after {MAX_REDRAWS} draws")
