"""C1: the probe generators are exact in length, put the needle at the requested depth, keep the
answer unique in the haystack, and are pure functions of their seed."""

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from hybrid_lightning.data.synthetic import FACT_TEMPLATES, QUERY_TEMPLATES
from hybrid_lightning.data.tokenizer import ByteTokenizer
from hybrid_lightning.probes.haystack import NOISE, sentences
from hybrid_lightning.probes.tasks import RULER_DEPTHS, TASKS, GenContext, make_sample

TOK = ByteTokenizer()
# The haystack text: a standard-library module's source (long docstrings), there in every Python the package allows
# (numpy's own files move between its versions: numeric.py is core/ in numpy 1 and _core/ in numpy 2).
ESSAY = TOK.encode(Path(argparse.__file__).read_text())
CTX = GenContext(TOK, ESSAY)


class WordTokenizer:
    """A tokenizer whose tokens are not bytes: one id per whitespace-separated chunk (and per space)."""

    eos_id = 0

    def __init__(self):
        self.vocab: dict[str, int] = {"<eos>": 0}

    def encode(self, text: str) -> np.ndarray:
        parts = [p for chunk in text.split(" ") for p in (chunk, " ")][:-1]
        return np.array([self.vocab.setdefault(p, len(self.vocab)) for p in parts if p], dtype=np.int64)

    def decode(self, ids) -> str:
        inv = {i: w for w, i in self.vocab.items()}
        return "".join(inv[int(i)] for i in ids)


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("length", [1400, 2500])
def test_exact_length_depth_and_unique_answer(task, length):
    for depth in (0.0, 0.3, 0.75, 1.0):
        s = make_sample(task, CTX, length, depth, 0)
        assert len(s.prompt) + len(s.answer) == length
        # every answer token with a source is a copy of that prompt token; the sources are the value spans
        has = s.answer_source >= 0
        assert has.sum() >= len(s.answer) // 2
        assert (s.prompt[s.answer_source[has]] == s.answer[has]).all()
        for a, b in s.value_spans:
            assert any(x <= a and b <= y for x, y in s.needle_spans)
            value = s.prompt[a:b]
            # unique: the value occurs only inside the needles (passkey states it twice in its needle)
            hits = [i for i in range(len(s.prompt) - len(value) + 1) if (s.prompt[i : i + len(value)] == value).all()]
            assert all(any(x <= i and i + len(value) <= y for x, y in s.needle_spans) for i in hits)
        # the queried needle sits where requested, give or take one haystack unit (a sentence, a noise
        # block or a distractor needle: at most 120 tokens here)
        assert abs(haystack_depth(s, 0) - depth) * haystack_tokens(s) <= 120, (task, depth)


def haystack_tokens(s) -> int:
    """Tokens of the haystack without its needles."""
    h0, h1 = s.haystack_span
    return h1 - h0 - sum(y - x for x, y in s.needle_spans)


def haystack_depth(s, i: int) -> float:
    """Depth of needle i: haystack tokens (other needles not counted) before it, as a share of all."""
    x = s.needle_spans[i][0]
    before = x - s.haystack_span[0] - sum(b - a for a, b in s.needle_spans if b <= x)
    return before / haystack_tokens(s)


def test_depth_orders_needles():
    for task in ("passkey", "niah_single_1", "niah_single_2", "niah_multikey_2", "vt"):
        samples = [make_sample(task, CTX, 3000, d, 0) for d in (0.0, 0.25, 0.5, 0.75, 1.0)]
        pos = [s.needle_pos for s in samples]
        assert pos == sorted(pos) and haystack_depth(samples[-1], 0) - haystack_depth(samples[0], 0) > 0.9, (task, pos)


def test_same_seed_same_sample_other_seed_other_sample():
    for task in TASKS:
        a, b = make_sample(task, CTX, 1400, 0.5, 3, seed=1), make_sample(task, CTX, 1400, 0.5, 3, seed=1)
        assert np.array_equal(a.prompt, b.prompt) and np.array_equal(a.answer, b.answer)
        c, d = make_sample(task, CTX, 1400, 0.5, 3, seed=2), make_sample(task, CTX, 1400, 0.5, 4, seed=1)
        assert not np.array_equal(a.answer, c.answer) and not np.array_equal(a.answer, d.answer)


def test_prompts_read_as_the_papers_write_them():
    s = make_sample("passkey", CTX, 600, 0.5, 0)
    text, key = TOK.decode(s.prompt), TOK.decode(s.answer).strip()
    assert text.startswith("There is an important info hidden inside a lot of irrelevant text.")
    assert f"The pass key is {key}. Remember it. {key} is the pass key." in text
    assert text.endswith("What is the pass key? The pass key is") and 1 <= int(key) <= 50000
    s = make_sample("niah_single_1", CTX, 800, 0.5, 0)
    text, value = TOK.decode(s.prompt), TOK.decode(s.answer).strip()
    assert text.startswith("A special magic number is hidden within the following text.")
    assert f"is: {value}." in text and len(value) == 7 and "The grass is green. The sky is blue." in text
    assert text.endswith("mentioned in the provided text is")
    s = make_sample("niah_multivalue", CTX, 1500, 0.5, 0)
    values = TOK.decode(s.answer).strip().split(", ")
    assert len(values) == 4 and all(f"is: {v}." in TOK.decode(s.prompt) for v in values)
    s = make_sample("vt", CTX, 1600, 0.2, 0)
    names = TOK.decode(s.answer).split()
    assert len(names) == 5 and all(f"VAR {b} = VAR {a}" in TOK.decode(s.prompt) for a, b in zip(names, names[1:]))


def test_probe_templates_stay_out_of_training():
    for template in FACT_TEMPLATES + QUERY_TEMPLATES:
        assert "magic" not in template and "pass key" not in template


def test_long_values_and_another_tokenizer():
    ctx = GenContext(TOK, ESSAY, value_tokens=20)
    for task in ("passkey", "niah_single_1", "niah_single_3", "niah_multikey_3"):
        s = make_sample(task, ctx, 1200, 0.5, 0)
        assert min(b - a for a, b in s.value_spans) >= 20
    words = WordTokenizer()
    wctx = GenContext(words, words.encode(" ".join(["lorem ipsum dolor sit amet,\n"] * 400)))
    for task in TASKS:
        s = make_sample(task, wctx, 900, 0.5, 1)
        assert len(s.prompt) + len(s.answer) == 900
        has = s.answer_source >= 0
        assert (s.prompt[s.answer_source[has]] == s.answer[has]).all()


def test_unreachable_value_length_names_the_field():
    words = WordTokenizer()
    with pytest.raises(ValueError, match="eval.value_tokens"):
        make_sample("niah_single_1", GenContext(words, None, value_tokens=16), 900, 0.5, 0)


def test_too_short_length_names_the_field():
    with pytest.raises(ValueError, match="eval.lengths: 200 tokens is too short for task 'niah_single_1'"):
        make_sample("niah_single_1", CTX, 200, 0.5, 0)


def test_probes_command_writes_documents_in_the_probe_format(tmp_path):
    out = tmp_path / "probes.jsonl"
    r = run_cli("probes", "passkey", "niah_single_2", "--lengths", "450", "600", "--samples", "3",
                "--value-tokens", "16",
                "--seed", "5", "--out", str(out), timeout=300)
    assert r.returncode == 0 and "12 probes written" in r.stdout, r.stdout + r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["task"], x["length"]) for x in rows[::3]] == [("passkey", 450), ("passkey", 600),
                                                             ("niah_single_2", 450), ("niah_single_2", 600)]
    assert [x["depth"] for x in rows[:3]] == [0.0, 0.5, 1.0]
    tok = ByteTokenizer()
    for x in rows:  # exact length in tokens, ending with its answer of >= 16 tokens
        assert (len(tok.encode(x["text"])) == x["length"] and x["text"].endswith(x["answer"])
                and len(tok.encode(x["answer"])) >= 16)
    bad = run_cli("probes", "passkee", "--lengths", "300", "--out", str(tmp_path / "x.jsonl"), timeout=300)
    assert bad.returncode != 0 and "tasks: ['passkee'] not among" in bad.stderr and not (tmp_path / "x.jsonl").exists()
    short = run_cli("probes", "niah_single_2", "--lengths", "300", "--out", str(tmp_path / "y.jsonl"), timeout=300)
    assert (short.returncode != 0 and "--lengths: 300 tokens is too short" in short.stderr
            and not (tmp_path / "y.jsonl").exists())


@pytest.mark.parametrize("task, needles", [("niah_multikey_1", 4), ("niah_multivalue", 4), ("niah_multiquery", 4)])
def test_other_needles_stand_at_their_own_random_depths(task, needles):
    """RULER gives every needle its own depth: the queried needle stays at the requested depth, the
    others are spread over the haystack (drawn from RULER's grid of 40 depths), not beside it."""
    spread = []
    for index in range(6):
        s = make_sample(task, CTX, 3000, 0.5, index)
        assert len(s.needle_spans) == needles
        depths = [haystack_depth(s, i) for i in range(needles)]
        assert abs(depths[0] - 0.5) * haystack_tokens(s) <= 120  # the queried needle
        others = depths[1:]
        # each other needle stands near a grid point (within a unit of <= 120 tokens)
        assert all(min(abs(RULER_DEPTHS - d)) * haystack_tokens(s) <= 120 for d in others), others
        spread += others
    assert min(spread) < 0.2 and max(spread) > 0.8  # over the whole haystack, not around the queried one
    assert sum(abs(d - 0.5) > 0.1 for d in spread) >= len(spread) // 2


def test_multi_value_answers_list_values_in_context_order_and_name_them():
    s = make_sample("niah_multivalue", CTX, 3000, 0.0, 2)
    starts = [a for a, _ in s.value_spans]
    assert starts == sorted(starts)
    assert TOK.decode(s.answer) == " " + ", ".join(s.references)
    q = make_sample("niah_multiquery", CTX, 3000, 0.3, 1)
    keys = TOK.decode(q.prompt).rsplit("The special magic numbers for ", 1)[1].split(" mentioned")[0]
    assert len(q.references) == 4 and all(f"for {k} is: {v}." in TOK.decode(q.prompt) for k, v in
                                          zip(keys.replace(", and ", ", ").split(", "), q.references))


def test_vt_chain_spread_over_the_haystack_with_rulers_example():
    s = make_sample("vt", CTX, 3000, 0.5, 0)
    text = TOK.decode(s.prompt)
    # RULER's in-context example first: a solved vt prompt with 3-letter names, then the task itself
    example, task = text.split("\n\nMemorize and track", 1)
    assert example.startswith("Memorize and track the chain(s) of variable assignment hidden in the following text.")
    assert "variables are assigned the value" in example and "assgined" not in text
    names = example.rsplit("they are: ", 1)[1].split()
    assert len(names) == 5 and all(len(n) == 3 for n in names)
    assert all(f"VAR {b} = VAR {a}" in example for a, b in zip(names, names[1:]))
    assert text.endswith("5 variables are assigned the value "
                         + task.split("VAR ")[1].split(" = ")[1].split("\n")[0] + ", they are:")
    # the chain: in order, one statement at the requested depth, the others spread over the haystack
    order = sorted(range(5), key=lambda i: s.needle_spans[i][0])
    chain = [TOK.decode(s.prompt[a:b]) for a, b in (s.needle_spans[i] for i in order)]
    assert [c.split()[1] for c in chain] == list(s.references)
    assert abs(haystack_depth(s, 0) - 0.5) * haystack_tokens(s) <= 120
    lasts, firsts = [], []
    for index in range(8):
        x = make_sample("vt", CTX, 3000, 0.0, index)
        depths = sorted(haystack_depth(x, i) for i in range(5))
        firsts.append(depths[0])
        lasts.append(depths[-1])
    assert max(firsts) * 3000 < 150  # depth 0: the value's statement opens the haystack
    assert np.mean(lasts) > 0.6  # and the chain reaches across it (not bunched after its first statement)
    # without the example: the task alone
    plain = make_sample("vt", GenContext(TOK, ESSAY, vt_example=False), 3000, 0.5, 0)
    assert (TOK.decode(plain.prompt).count("Memorize and track") == 1
            and TOK.decode(plain.prompt).count("Question:") == 1)


def test_vt_example_needs_room_and_the_error_says_how_to_drop_it():
    with pytest.raises(ValueError, match="eval.vt_example: false"):
        make_sample("vt", CTX, 900, 0.5, 0)
    assert len(make_sample("vt", GenContext(TOK, ESSAY, vt_example=False), 900, 0.5, 0).prompt) > 0


def split_into(text: str, whole: set[str]) -> list[str]:
    """``text`` read as whole sentences of ``whole`` separated by whitespace (longest match first);
    fails on anything else, e.g. a sentence cut short."""
    by_start: dict[str, list[str]] = {}
    for w in sorted(whole, key=len, reverse=True):
        by_start.setdefault(w[:1], []).append(w)
    out, rest = [], text.lstrip()
    while rest:
        match = next((w for w in by_start.get(rest[:1], [])
                      if rest.startswith(w) and rest[len(w) : len(w) + 1].isspace()
                      or rest == w), None)
        assert match, f"not a whole sentence: {rest[:80]!r}"
        out.append(match)
        rest = rest[len(match) :].lstrip()
    return out


@pytest.mark.parametrize("task", ["passkey", "niah_single_1", "vt", "niah_single_2", "niah_multikey_2"])
def test_haystacks_are_whole_sentences(task):
    """No haystack piece is cut inside a sentence: with the needles taken out, what remains is whole
    noise sentences, whole distractor needles or whole sentences of the essay text (as the essay's
    own text cuts into sentences; twice over, for a haystack that wraps around its end)."""
    essay = {x.strip() for x in sentences(TOK.decode(ESSAY) * 2)} - {""}
    noise = {x.strip() for x in sentences(NOISE)}
    for depth in (0.0, 0.4, 1.0):
        s = make_sample(task, CTX, 2000, depth, 1)
        h0, h1 = s.haystack_span
        cuts = sorted(s.needle_spans)
        pieces = [TOK.decode(s.prompt[a:b]) for a, b in zip([h0] + [e for _, e in cuts], [x for x, _ in cuts] + [h1])]
        if task == "niah_multikey_2":
            found = [x.strip() for piece in pieces for x in piece.splitlines() if x.strip()]
            assert all(re.fullmatch(r"One of the special magic numbers for [\w-]+ is: \d{7}\.", x)
                       for x in found), found
        else:
            found = [x for piece in pieces for x in split_into(piece, essay if task == "niah_single_2" else noise)]
        assert len(found) > 10
