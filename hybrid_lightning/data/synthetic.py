"""Retrieval-dense synthetic sequences: key -> value facts stated among real-text filler and
queried again later in the same sequence, so that predicting the queried value needs
long-range retrieval.

A sequence is a chain of pieces drawn with weights filler : fact : repeat : query =
1 : 1 : r : q (r = ``repeat_spans``, q = ``queries_per_fact``): filler is a span of real
training text, a fact states a new key's value, a repeat copies an earlier span of the
sequence verbatim (the plainest long-range signal, from which induction heads form), a
query restates an earlier fact (chosen uniformly, so distances spread over the whole
sequence), with probability ``repeat_template`` in the template it was stated in
(retrievable by matching the preceding text: induction), else in a question template (the
key must be looked up). The queried value tokens are the retrieval targets; ``sample``
returns their mask.

The templates here are deliberately different from the evaluation probes (RULER's "special
magic" needles and the pass-key prompt), which must stay out of training; the value kinds
(digits, words, hex and UUID-like strings) cover those the probes use.
"""

from __future__ import annotations

import numpy as np

from hybrid_lightning.config import SyntheticConfig

ATTRS = ("code", "id", "tag", "serial", "label", "number", "token", "value")
FACT_TEMPLATES = (
    "{key} = {value}\n",
    "The {attr} of {key} is {value}.\n",
    "{key} ({attr}): {value}\n",
    "Note that {key} has {attr} {value}.\n",
    "One of the hidden {attr}s for {key} is: {value}.\n",
    "The {attr} of {key} is {value}. Keep it in mind. {value} is the {attr} of {key}.\n",
)
QUERY_TEMPLATES = (
    "{key} = {value}\n",
    "What is the {attr} of {key}? {value}\n",
    "Recall: the {attr} of {key} is {value}.\n",
    "{key} ({attr}): {value}\n",
    "What is the hidden {attr} for {key} mentioned above? The hidden {attr} for {key} mentioned above is {value}.\n",
    "What is the {attr} of {key}? The {attr} of {key} is {value}.\n",
)
_CONS, _VOW = "bdfgklmnprstvz", "aeiou"
FILLER_TOKENS = (16, 96)  # min, max tokens of a filler span or a repeated span
PIECES = ("filler", "fact", "repeat", "query")


def pseudo_word(rng: np.random.Generator, syllables: int) -> str:
    return "".join(_CONS[rng.integers(len(_CONS))] + _VOW[rng.integers(len(_VOW))] for _ in range(syllables))


def random_value(rng: np.random.Generator, n_chars: int) -> str:
    kind = rng.integers(4)
    if kind == 0:  # digits
        return "".join(str(d) for d in rng.integers(0, 10, n_chars))
    if kind == 1:  # hex
        return "".join("0123456789abcdef"[d] for d in rng.integers(0, 16, n_chars))
    if kind == 2:  # UUID-like: hex groups joined by dashes
        s = "".join("0123456789abcdef"[d] for d in rng.integers(0, 16, n_chars))
        return "-".join(s[i : i + 8] for i in range(0, len(s), 8))
    words = []
    while sum(len(w) + 1 for w in words) < n_chars:
        words.append(pseudo_word(rng, int(rng.integers(1, 4))))
    return " ".join(words)


class RetrievalSynth:
    """Builds synthetic sequences from a tokenizer and a stream of real filler tokens."""

    def __init__(self, tokenizer, filler: np.ndarray, cfg: SyntheticConfig):
        assert filler.size > FILLER_TOKENS[1], "filler stream too short"
        self.tok, self.filler, self.cfg = tokenizer, filler, cfg

    def sample(self, rng: np.random.Generator, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """Returns (tokens, target_mask), both of length n_tokens; the mask is True on queried values."""
        pieces: list[np.ndarray] = []
        masks: list[np.ndarray] = []
        facts: list[tuple[tuple[str, str, str], str]] = []  # ((key, attr, value), template stated in)
        keys: set[str] = set()
        length = 0
        while length < n_tokens:
            weights = np.array([
                1.0,  # filler
                1.0,  # a new fact
                self.cfg.repeat_spans if length >= FILLER_TOKENS[0] else 0.0,
                self.cfg.queries_per_fact if facts else 0.0,
            ])
            kind = rng.choice(PIECES, p=weights / weights.sum())
            if kind == "filler":
                n = int(rng.integers(FILLER_TOKENS[0], FILLER_TOKENS[1] + 1))
                start = int(rng.integers(0, self.filler.size - n))
                ids, mask = np.asarray(self.filler[start : start + n], dtype=np.int64), np.zeros(n, bool)
            elif kind == "fact":
                key = self._new_key(rng, keys)
                lo, hi = self.cfg.value_chars
                fact = (key, ATTRS[rng.integers(len(ATTRS))], random_value(rng, int(rng.integers(lo, hi + 1))))
                template = FACT_TEMPLATES[rng.integers(len(FACT_TEMPLATES))]
                facts.append((fact, template))
                ids, mask = self._render(template, fact, target=False)
            elif kind == "repeat":  # a verbatim copy of an earlier span of this sequence
                n = int(rng.integers(FILLER_TOKENS[0], min(FILLER_TOKENS[1], length) + 1))
                start = int(rng.integers(0, length - n + 1))
                ids, mask = np.concatenate(pieces)[start : start + n], np.zeros(n, bool)
            else:  # a query of an earlier fact: its own template again, or a question form
                fact, template = facts[rng.integers(len(facts))]
                if rng.random() >= self.cfg.repeat_template:
                    template = QUERY_TEMPLATES[rng.integers(len(QUERY_TEMPLATES))]
                ids, mask = self._render(template, fact, target=True)
            pieces.append(ids)
            masks.append(mask)
            length += ids.size
        return np.concatenate(pieces)[:n_tokens], np.concatenate(masks)[:n_tokens]

    def _new_key(self, rng: np.random.Generator, keys: set[str]) -> str:
        while True:
            key = f"{pseudo_word(rng, 2)}-{pseudo_word(rng, 2)}"
            if key not in keys:
                keys.add(key)
                return key

    def _render(self, template: str, fact: tuple[str, str, str], target: bool) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of a filled template, encoded piece by piece (text, value, text, ...), and the mask
        of its value tokens when it is a query (``target``)."""
        key, attr, value = fact
        value_ids = self.tok.encode(value)
        ids, mask = [], []
        for i, text in enumerate(template.split("{value}")):
            if i:
                ids.append(value_ids)
                mask.append(np.full(value_ids.size, target))
            text_ids = self.tok.encode(text.format(key=key, attr=attr))
            ids.append(text_ids)
            mask.append(np.zeros(text_ids.size, bool))
        return np.concatenate(ids), np.concatenate(mask)
