"""Long-context probe generators: passkey retrieval and RULER's needle-in-a-haystack family.

- ``passkey``: Mohtashami & Jaggi 2023 (arXiv 2305.16300): repeated filler sentences, "The pass key is {k}. Remember
  it. {k} is the pass key.", the question at the end; k in 1..50000.
- ``niah_*`` and ``vt``: RULER (Hsieh et al. 2024, arXiv 2404.06654, NVIDIA/RULER), in the words of its current
  templates: needles "One of the special magic {type} for {key} is: {value}." in a noise haystack (the repeated
  sentence block), an essay haystack (held-out real text of the run's corpus) or a haystack of distractor needles;
  keys are adjective-noun words (wonderwords' lists, as RULER) or UUIDs, values 7-digit numbers, words or UUIDs.
  ``vt`` is variable tracking: one chain ``VAR A = 12345``, ``VAR B = VAR A``, ... (4 hops) in noise, preceded by
  RULER's in-context example (a complete small VT prompt with its answer; ``eval.vt_example: false`` leaves it out);
  the answer names every variable of the chain.

Depth. RULER draws a random depth for every needle. Here the queried needle (for multi-query the first queried
key's, for multi-value the first value drawn) sits at the requested ``depth``, so that accuracy can be read by
depth; every other needle of the probe (the other values of multi-value, the other keys of multi-key and
multi-query) gets its own depth, drawn without repeats from RULER's grid of 40 depths (0, 3, 5, 8, ..., 100%). A
variable-tracking chain is spread over the haystack as RULER spreads it (its statements at independent uniform
depths, in chain order), one statement, drawn at random, at ``depth``.

Every sample is exactly ``length`` tokens (prompt + answer). The haystack is made of whole units, never cut inside a
sentence, up to the token budget left by the fixed text: noise blocks (the last one ends after its last sentence
that fits), sentences of the essay text (text without a sentence end for ``haystack.LONG_SENTENCE`` characters, such
as source code, counts its lines as sentences) or distractor needles. The tokens still missing (less than a
sentence) are single spaces, or blank lines after a unit that ends a line, spread over the unit boundaries. Needles
sit at the unit boundary nearest their depth x haystack tokens. Text is tokenized piece by piece (instruction, each
key, each value, ...) and the pieces concatenated, so a value has the same tokens in its needle and in the answer
whatever the tokenizer.

Answers with several values list them as " v1, v2, ..." (per queried key in query order, each key's values in
context order); ``vt`` lists the variables in chain order separated by spaces. Each sample also carries the values
as text (``references``) and RULER's generation budget for its task, for the generation score (scoring.py).
"""

from __future__ import annotations

import functools
import math
import uuid
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from hybrid_lightning.probes.chance import answer_chance, integers, names_chance
from hybrid_lightning.probes.haystack import NOISE, Piece, assemble, count, essay_units, fill, noise_units

PASSKEY_HEAD = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
                "I will quiz you about the important information there.\n")
PASSKEY_RANGE = (1, 50000)
NUMBER_DIGITS = 7  # RULER's numbers
VT_HOPS, VT_VAR_LETTERS = 4, 5  # RULER's defaults: one chain of 4 hops, 5-letter variable names
VT_VALUE_RANGE = (10000, 99999)
# RULER's in-context example: a chain of the same hops with 3-letter names; RULER fills it to 500
# tokens of its tokenizer, here it holds 5 noise blocks (the smallest haystack RULER's search tries),
# so that it also fits short probes.
VT_EXAMPLE_LETTERS, VT_EXAMPLE_BLOCKS = 3, 5
VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
RULER_DEPTHS = np.round(np.linspace(0, 100, 40)) / 100  # RULER's depth grid (its DEPTHS), as fractions
# Tokens to generate: RULER's tokens_to_generate per task family (scripts/data/synthetic/constants.py);
# passkey, not a RULER task, Mohtashami & Jaggi's max_new_tokens (landmark-attention, llama/run_test.py).
GENERATE_TOKENS = {"niah": 128, "vt": 30, "passkey": 10}
MAX_REDRAWS = 100
MAX_UNITS = 256  # how far long_value lengthens a value before giving up


@dataclass(frozen=True)
class Sample:
    """One probe. ``prompt`` ends with the answer prefix; ``len(prompt) + len(answer) == length``.

    ``haystack_span``: [start, end) of the haystack, needles included, between the instruction and
    the question; ``needle_spans``: [start, end) of every needle statement, the one at the requested
    depth first; ``value_spans``: the span of each value the answer copies, in answer order;
    ``answer_source[j]``: the prompt position holding answer token j (-1 for separators), so
    ``prompt[answer_source[j]] == answer[j]`` wherever it is >= 0. ``chance_nll``: -log P(answer)
    under the value prior (nats), i.e. what a model that knows the answer's format but retrieves
    nothing pays for it; ``chance_correct``: the answer tokens such a model gets right, expected (probes/chance.py).
    ``references``: the answer's values as text (RULER's reference outputs);
    ``generate_tokens``: tokens to generate for the generation score (RULER's budget for the task,
    at least the answer's length).
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
    chance_correct: float
    haystack_span: tuple[int, int]
    references: tuple[str, ...]
    generate_tokens: int

    @property
    def needle_pos(self) -> int:
        """Start of the needle placed at the requested depth."""
        return self.needle_spans[0][0]

    def distance(self) -> int:
        """Tokens from the first value the answer copies to the position that predicts its first token."""
        return len(self.prompt) - 1 - self.value_spans[0][0]

    def in_window(self, window: int) -> bool:
        """Whether every answer token's source lies within ``window`` tokens (current one included)
        of the position that predicts it: a sliding-window layer of that window can see it."""
        pred = len(self.prompt) - 1 + np.arange(len(self.answer))
        has = self.answer_source >= 0
        return bool((pred[has] - self.answer_source[has] < window).all())


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
    for n in range(units, units + MAX_UNITS):
        text, log_n = draw_value(kind, rng, n)
        if min_tokens is None or len(tok.encode(" " + text)) >= min_tokens:
            return text, log_n
    raise ValueError(f"eval.value_tokens: {kind} values do not reach {min_tokens} tokens with this tokenizer")


@dataclass(frozen=True)
class GenContext:
    """What generators need besides the random state: the tokenizer, held-out real text for essay
    haystacks, an optional minimum value length in tokens (long answers for head probing) and
    whether variable tracking gets RULER's in-context example."""

    tok: object
    essay: np.ndarray | None = None
    value_tokens: int | None = None
    vt_example: bool = True


def _other_depths(rng: np.random.Generator, depth: float, n: int) -> list[float]:
    """``n`` depths of RULER's grid, drawn without repeats and without the grid point nearest ``depth``."""
    grid = np.delete(RULER_DEPTHS, np.abs(RULER_DEPTHS - depth).argmin())
    return rng.choice(grid, size=n, replace=False).tolist()


@dataclass(frozen=True)
class Niah:
    """A RULER needle-in-a-haystack task (one row of RULER's task table)."""

    haystack: str  # noise | essay | needles
    key: str  # words | uuids
    value: str  # numbers | words | uuids
    keys: int = 1
    values: int = 1
    queries: int = 1
    generate_tokens: int = GENERATE_TOKENS["niah"]

    def draw(self, ctx: GenContext, rng: np.random.Generator, length: int, depth: float, task: str) -> Sample:
        tok, single = ctx.tok, self.values * self.queries == 1
        plural, kind = self.value, self.value[:-1]
        end = " " if self.haystack == "essay" else "\n"  # RULER joins essay sentences with spaces, others with newlines
        keys = _distinct(lambda: long_value(self.key, rng, tok, None)[0], self.keys)
        facts = [(k, long_value(self.value, rng, tok, ctx.value_tokens, _units(self.value)))
                 for k in keys for _ in range(self.values)]
        queried = [keys[i] for i in rng.permutation(self.keys)[: self.queries]]
        needles = [Piece(tok, ["One of the special magic " + plural + " for", (" " + k, "key"), " is:",
                               (" " + v, "value"), "." + end]) for k, (v, _) in facts]
        anchor = next(i for i, (k, _) in enumerate(facts) if k == queried[0])  # the queried needle: at ``depth``
        depths = _other_depths(rng, depth, len(facts) - 1)
        depths.insert(anchor, depth)
        query = ", ".join(queried[:-1]) + ", and " + queried[-1] if len(queried) > 1 else queried[0]
        t = kind if single else plural
        head = Piece(tok, [f"{'A' if single else 'Some'} special magic {t} {'is' if single else 'are'} hidden "
                           f"within the following text. Make sure to memorize it. I will quiz you about the {t} "
                           "afterwards.\n"])
        tail = Piece(tok, [f"\nWhat {'is' if single else 'are all'} the special magic {t} for", " " + query,
                           f" mentioned in the provided text? The special magic {t} for", " " + query,
                           f" mentioned in the provided text {'is' if single else 'are'}"])
        answered = [v for q in queried for k, (v, _) in facts if k == q]  # in any order: same tokens
        budget = _budget(length, task, head, tail, _answer(tok, answered), needles)
        if self.haystack == "noise":
            units = noise_units(tok, "\n")
        elif self.haystack == "essay":
            units = essay_units(ctx, rng, budget)
        else:
            units = self._distractors(ctx, rng, keys)
        order = rng.permutation(len(needles)).tolist()  # needles at one boundary: shuffled, as RULER shuffles them
        prompt, placed = assemble(head, fill(tok, units, budget), [(depths[i], needles[i]) for i in order], tail)
        placed = [placed[order.index(i)] for i in range(len(needles))] + placed[-1:]  # back to fact order
        # per queried key (query order), its values in context order
        answer_of = [i for q in queried
                     for i in sorted((i for i, f in enumerate(facts) if f[0] == q), key=lambda i: placed[i]["_"])]
        values = [facts[i][1][0] for i in answer_of]
        spans = [placed[i]["value"] for i in answer_of]
        needle_order = [anchor] + [i for i in range(len(facts)) if i != anchor]
        return _sample(task, length, depth, prompt, _answer(tok, values),
                       [placed[i] for i in needle_order] + placed[-1:], spans, sum(facts[i][1][1] for i in answer_of),
                       _chance(tok, self.value, values), values, self.generate_tokens)

    def _distractors(self, ctx: GenContext, rng: np.random.Generator, keys: list[str]) -> Iterator[list[np.ndarray]]:
        """Endless needles with fresh keys (none of ``keys``) and values, drawn as the haystack consumes them."""
        while True:
            k = long_value(self.key, rng, ctx.tok, None)[0]
            if k in keys:
                continue
            v = long_value(self.value, rng, ctx.tok, ctx.value_tokens, _units(self.value))[0]
            yield [ctx.tok.encode(f"One of the special magic {self.value} for {k} is: {v}.\n")]


def _chance(tok, kind: str, values: list[str]) -> float:
    """``Sample.chance_correct`` of the answer " v1, v2, ..." of values of ``kind`` (probes/chance.py)."""
    vocabulary = word_lists() if kind == "words" else integers(*PASSKEY_RANGE) if kind == "passkey" else ()
    return answer_chance(tok, kind, values, vocabulary)


def _answer(tok, values: list[str]) -> Piece:
    """The answer " v1, v2, ...", each value labelled a0, a1, ..."""
    return Piece(tok, [part for n, v in enumerate(values) for part in ([","] if n else []) + [(" " + v, f"a{n}")]])


def _units(kind: str) -> int:
    return NUMBER_DIGITS if kind == "numbers" else 1


def _distinct(draw, n: int, exclude: Iterable = ()) -> list:
    out: list = []
    while len(out) < n:
        v = draw()
        if v not in out and v not in exclude:
            out.append(v)
    return out


def _budget(length: int, task: str, *pieces, note: str = "") -> int:
    fixed = sum(len(p.ids) for group in pieces for p in (group if isinstance(group, list) else [group]))
    if fixed > length:
        raise ValueError(f"eval.lengths: {length} tokens is too short for task {task!r}: its text without haystack "
                         f"takes {fixed} tokens with this tokenizer{note}")
    return length - fixed


def _sample(task, length, depth, prompt, answer: Piece, placed, value_spans, chance_nll, chance_correct, references,
            generate_tokens: int) -> Sample:
    """The Sample of an assembled probe; ``placed``: the needles' spans, the one at ``depth`` first,
    then the haystack's."""
    source = np.full(len(answer.ids), -1, np.int64)
    for n, (s, e) in enumerate(value_spans):
        a0, a1 = answer.spans[f"a{n}"]
        assert e - s == a1 - a0
        source[a0:a1] = np.arange(s, e)
    sample = Sample(task=task, length=length, depth=depth, prompt=prompt, answer=answer.ids, answer_source=source,
                    needle_spans=tuple(p["_"] for p in placed[:-1]), value_spans=tuple(value_spans),
                    chance_nll=chance_nll, chance_correct=chance_correct, haystack_span=placed[-1]["haystack"],
                    references=tuple(references), generate_tokens=max(generate_tokens, len(answer.ids)))
    assert len(sample.prompt) + len(sample.answer) == length
    assert (prompt[source[source >= 0]] == answer.ids[source >= 0]).all()
    return sample


@dataclass(frozen=True)
class Passkey:
    """Pass-key retrieval (Mohtashami & Jaggi 2023)."""

    generate_tokens: int = GENERATE_TOKENS["passkey"]

    def draw(self, ctx: GenContext, rng: np.random.Generator, length: int, depth: float, task: str) -> Sample:
        tok = ctx.tok
        if ctx.value_tokens is None:
            lo, hi = PASSKEY_RANGE
            key, log_n = str(int(rng.integers(lo, hi + 1))), math.log(hi - lo + 1)
        else:
            key, log_n = long_value("numbers", rng, tok, ctx.value_tokens, units=len(str(PASSKEY_RANGE[1])))
        needle = Piece(tok, ["\nThe pass key is", (" " + key, "value"), ". Remember it.", " " + key,
                             " is the pass key.\n"])
        head, tail = Piece(tok, [PASSKEY_HEAD]), Piece(tok, ["\nWhat is the pass key? The pass key is"])
        answer = _answer(tok, [key])
        budget = _budget(length, task, head, tail, answer, needle)
        prompt, placed = assemble(head, fill(tok, noise_units(tok, " "), budget), [(depth, needle)], tail)
        kind = "passkey" if ctx.value_tokens is None else "numbers"
        return _sample(task, length, depth, prompt, answer, placed, [placed[0]["value"]], log_n,
                       _chance(tok, kind, [key]), [key], self.generate_tokens)


@dataclass(frozen=True)
class VariableTracking:
    """RULER's variable tracking: one chain of ``VT_HOPS`` hops in noise, its statements at uniform
    random depths in chain order, one of them (drawn at random) at ``depth``; RULER's in-context
    example before the task unless ``GenContext.vt_example`` is off."""

    generate_tokens: int = GENERATE_TOKENS["vt"]

    def draw(self, ctx: GenContext, rng: np.random.Generator, length: int, depth: float, task: str) -> Sample:
        tok = ctx.tok
        names = _names(rng, VT_VAR_LETTERS)
        value = str(int(rng.integers(VT_VALUE_RANGE[0], VT_VALUE_RANGE[1] + 1)))
        chain = [Piece(tok, ["VAR", (" " + names[0], "var"), " = " + value + "\n"])]
        chain += [Piece(tok, ["VAR", (" " + b, "var"), " = VAR", " " + a, " \n"]) for a, b in zip(names, names[1:])]
        example = self._example(ctx, rng, value) if ctx.vt_example else ""
        head = Piece(tok, [example, VT_HEAD])
        tail = Piece(tok, [_vt_question(value)])
        answer = Piece(tok, [(" " + name, f"a{n}") for n, name in enumerate(names)])
        note = " (RULER's in-context example included; eval.vt_example: false leaves it out)" if ctx.vt_example else ""
        budget = _budget(length, task, head, tail, answer, chain, note=note)
        others = rng.uniform(0.0, 1.0, VT_HOPS)
        anchor = int((others < depth).sum())  # the statement at ``depth``: its rank among the chain's depths
        depths = sorted(others.tolist())
        depths.insert(anchor, depth)
        prompt, placed = assemble(head, fill(tok, noise_units(tok, "\n"), budget), list(zip(depths, chain)), tail)
        order = [anchor] + [i for i in range(len(chain)) if i != anchor]
        chance, correct = names_chance(tok, names)
        return _sample(task, length, depth, prompt, answer, [placed[i] for i in order] + placed[-1:],
                       [p["var"] for p in placed[:-1]], chance, correct, names, self.generate_tokens)

    @staticmethod
    def _example(ctx: GenContext, rng: np.random.Generator, value: str) -> str:
        """RULER's in-context example: a whole VT prompt with 3-letter names, another value, its chain
        at distinct random boundaries of ``VT_EXAMPLE_BLOCKS`` noise blocks, and its answer."""
        names = _names(rng, VT_EXAMPLE_LETTERS)
        ex_value = _distinct(lambda: str(int(rng.integers(VT_VALUE_RANGE[0], VT_VALUE_RANGE[1] + 1))), 1, [value])[0]
        chain = [f"VAR {names[0]} = {ex_value}"] + [f"VAR {b} = VAR {a} " for a, b in zip(names, names[1:])]
        lines = [NOISE] * VT_EXAMPLE_BLOCKS
        for j, p in enumerate(sorted(rng.choice(VT_EXAMPLE_BLOCKS, len(chain), replace=False).tolist())):
            lines.insert(p + j, chain[j])
        return VT_HEAD + "\n".join(lines) + _vt_question(ex_value) + " " + " ".join(names) + "\n\n"


def _names(rng: np.random.Generator, letters: int) -> list[str]:
    return _distinct(lambda: "".join(chr(65 + c) for c in rng.integers(0, 26, letters)), VT_HOPS + 1)


def _vt_question(value: str) -> str:
    """RULER's VT question and answer prefix (its current spelling, "assigned")."""
    return (f"\nQuestion: Find all variables that are assigned the value {value} in the text above. Answer: According "
            f"to the chain(s) of variable assignment in the text above, {VT_HOPS + 1} variables are assigned the value "
            f"{value}, they are:")


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
        if count(s.prompt, v) != sum(count(s.prompt[x:y], v) for x, y in s.needle_spans):
            return False
    return True


def make_sample(task: str, ctx: GenContext, length: int, depth: float, index: int, seed: int = 0) -> Sample:
    """Sample ``index`` of ``task`` at ``length`` tokens and needle ``depth``: a pure function of its
    arguments (and the tokenizer, essay text and context settings). Draws again while a value occurs
    outside its needle."""
    rng = np.random.default_rng([seed, zlib.crc32(task.encode()), length, round(depth * 1e6), index])
    for _ in range(MAX_REDRAWS):
        sample = TASKS[task].draw(ctx, rng, length, depth, task)
        if answer_is_unique(sample):
            return sample
    raise RuntimeError(f"{task}: no sample with a unique answer after {MAX_REDRAWS} draws")
