"""The chance level of the probes' answers: what a predictor that knows the answer's format but retrieves
nothing gets right under teacher forcing (``Sample.chance_correct``, probes/tasks.py).

The format is the value generator's own distribution (tasks.draw_value, the passkey range, variable
tracking's names): the characters each position can hold, the lengths, the leading space, the fixed parts.
At each answer character the best such predictor guesses the most likely character given the characters
before it and is right with that probability, max_c P(c | prefix): its expected accuracy there, exact from
the format:

    numbers   a digit 1-9, then digits 0-9: 1/9, then 1/10 each
    uuids     version-4 UUIDs: hex digits 1/16; the dashes and the version digit '4' certain; the variant 1/4
    words     adjective-noun pairs from wonderwords' lists, joined by '-': each character from the counts of
              the words sharing its prefix (the word's end competes as the character that follows it)
    passkey   an integer uniform in its range (``tasks.PASSKEY_RANGE``): each digit from the counts of the integers
              sharing its prefix, given that the answer goes on
    names     variable tracking's names of ``tasks.VT_VAR_LETTERS`` letters: 1/26 each
    fixed     the leading space, the "," between values, the spaces between names: certain

How many values an answer holds and how many units (digits, UUIDs, word pairs) each has count as format;
so does the answer's end. A token's chance is the product of its characters' chances: exact where each
answer token is one character (the byte tokenizer, ASCII values), the chance of guessing a merged token
character by character otherwise (an approximation). The chance loss stays -log P(answer) per answer token
(``Sample.chance_nll``), the cross-entropy of the same predictor.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence

import numpy as np

HEX, DIGITS, LETTERS = 16, 10, 26
UUID_DASHES, UUID_VERSION, UUID_VARIANT = (8, 13, 18, 23), 14, 19  # character positions in a 36-character UUID


_COUNTS: dict[int, tuple] = {}  # id of a vocabulary -> (the vocabulary, its prefix counts)


def _prefix_counts(words: Sequence[str]) -> tuple[dict[str, Counter], Counter]:
    """(prefix -> counts of the characters that follow it, strings equal to each prefix) of a uniform list;
    kept per list object (hashing a 50,000-entry tuple at every probe would cost more than the probe)."""
    hit = _COUNTS.get(id(words))
    if hit is None or hit[0] is not words:
        follow: dict[str, Counter] = {}
        for w in words:
            for i in range(len(w)):
                follow.setdefault(w[:i], Counter())[w[i]] += 1
        hit = _COUNTS[id(words)] = (words, (follow, Counter(words)))
    return hit[1]


def _from_list(words: Sequence[str], text: str, then: str | None) -> list[float]:
    """Chances of the characters of ``text``, one of the uniform ``words``, and (``then`` not None) of the
    character ``then`` that follows it: at each prefix the largest share among the next characters and the
    word's end (which is the character ``then``, merged with it where a longer word goes on with it).
    ``then`` None: the answer ends after the word, so the shares are of the words that go on."""
    follow, exact = _prefix_counts(words)
    out = []
    for i in range(len(text) + (then is not None)):
        nxt = Counter(follow.get(text[:i], {}))
        if then is not None:
            nxt[then] += exact[text[:i]]
        out.append(max(nxt.values()) / sum(nxt.values()))
    return out


@functools.cache
def integers(low: int, high: int) -> tuple[str, ...]:
    """The decimal texts of low ... high (the passkey's values)."""
    return tuple(str(k) for k in range(low, high + 1))


def value_chances(kind: str, text: str, then: str | None = None, vocabulary: tuple = ()) -> list[float]:
    """The chance of each character of a value ``text`` of ``kind`` (``numbers``, ``uuids``, ``words``,
    ``passkey``, ``names``), and of the separator ``then`` after it where one follows (None: the answer
    ends with this value). ``vocabulary``: for ``words`` the (adjectives, nouns) lists, for ``passkey``
    the value texts (``integers``)."""
    if kind == "numbers":
        chances = [1 / 9] + [1 / DIGITS] * (len(text) - 1)
    elif kind == "uuids":
        chances = [{**dict.fromkeys(UUID_DASHES, 1.0), UUID_VERSION: 1.0, UUID_VARIANT: 1 / 4}.get(i % 37, 1 / HEX)
                   if i % 37 != 36 else 1.0 for i in range(len(text))]  # 36 characters a UUID, then '-'
    elif kind == "names":
        chances = [1 / LETTERS] * len(text)
    elif kind == "passkey":
        return _from_list(vocabulary, text, then)
    elif kind == "words":
        return _words(text, then, vocabulary)
    else:
        raise ValueError(f"unknown value kind {kind!r}")
    return chances + [1.0] * (then is not None)  # fixed lengths: the separator is certain


def _words(text: str, then: str | None, lists: Sequence[Sequence[str]]) -> list[float]:
    """Adjective-noun pairs joined by '-' (their number known from the text): each word's characters from its
    list (``lists``: adjectives, nouns), the '-' after it or, after the last noun, ``then``."""
    words = _parse(text, _known(lists[0]), _known(lists[1]))
    if words is None:
        raise ValueError(f"{text!r} is not adjective-noun pairs of wonderwords' lists")
    out = []
    for i, w in enumerate(words):
        out += _from_list(lists[i % 2], w, "-" if i + 1 < len(words) else then)
    return out


def _known(words: Sequence[str]) -> Counter:
    """The strings of a vocabulary (its prefix counts' second part), for membership tests."""
    return _prefix_counts(words)[1]


def _parse(text: str, adjectives: Counter, nouns: Counter, i: int = 0) -> list[str] | None:
    """``text`` split into words alternating between the two lists (adjective first, ending with a noun) at
    dashes; words may hold dashes themselves, so each split is tried."""
    known = nouns if i % 2 else adjectives
    if i % 2 and text in known:
        return [text]
    for cut in (j for j, c in enumerate(text) if c == "-"):
        if text[:cut] in known and (rest := _parse(text[cut + 1 :], adjectives, nouns, i + 1)) is not None:
            return [text[:cut], *rest]
    return None


def answer_chance(tok, kind: str, values: list[str], vocabulary: tuple = ()) -> float:
    """``expected_correct`` of the answer " v1, v2, ..." (``tasks._answer``) of values of ``kind``."""
    pieces = []
    for n, v in enumerate(values):
        last = n + 1 == len(values)
        chances = value_chances(kind, v, None if last else ",", vocabulary)
        pieces.append((" " + v, [1.0, *chances[: len(v)]]))  # the leading space is certain
        if not last:
            pieces.append((",", chances[len(v) :]))
    return expected_correct(tok, pieces)


def names_chance(tok, names: list[str]) -> tuple[float, float]:
    """(-log P(answer), ``expected_correct``) of variable tracking's answer " n1 n2 ...": its names' letters
    uniform, the spaces certain."""
    nll = sum(len(name) for name in names) * float(np.log(LETTERS))
    return nll, expected_correct(tok, [(" " + name, [1.0, *value_chances("names", name)]) for name in names])


def expected_correct(tok, pieces: list[tuple[str, list[float]]]) -> float:
    """Expected correct answer tokens of the format-only predictor: ``pieces`` are the answer's texts as the
    probe tokenizes them one by one (``haystack.Piece``), each with the chance of each of its characters."""
    total = 0.0
    for text, chances in pieces:
        ids = tok.encode(text)
        if len(ids) == len(text):  # one token a character
            total += float(np.sum(chances))
            continue
        ends = [len(tok.decode(ids[: j + 1])) for j in range(len(ids))]  # character boundaries of the tokens
        starts = [0, *ends[:-1]]
        total += sum(float(np.prod(chances[a:b])) for a, b in zip(starts, ends))
    return total
