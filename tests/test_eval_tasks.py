"""C1: the probe generators are exact in length, put the needle at the requested depth, keep the
answer unique in the haystack, and are pure functions of their seed."""

import json

import numpy as np
import pytest

from hybrid_lightning.data.synthetic import FACT_TEMPLATES, QUERY_TEMPLATES
from hybrid_lightning.data.tokenizer import ByteTokenizer
from hybrid_lightning.eval.tasks import TASKS, GenContext, make_sample

from conftest import run_cli

TOK = ByteTokenizer()
ESSAY = TOK.encode(open(np.__file__.replace("__init__.py", "_core/numeric.py")).read())
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
@pytest.mark.parametrize("length", [1000, 2500])
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
        # the (first) needle sits where requested, give or take one haystack unit (a line, a sentence
        # block or a distractor needle: at most 120 tokens here)
        h0, h1 = s.haystack_span
        hay = h1 - h0 - sum(y - x for x, y in s.needle_spans)
        before = s.needle_pos - h0
        assert abs(before - depth * hay) <= 120, (task, depth, before, hay)


def test_depth_orders_needles():
    for task in ("passkey", "niah_single_1", "niah_single_2", "niah_multikey_2", "vt"):
        pos = [make_sample(task, CTX, 3000, d, 0).needle_pos for d in (0.0, 0.25, 0.5, 0.75, 1.0)]
        assert pos == sorted(pos) and pos[-1] - pos[0] > 2000, (task, pos)


def test_same_seed_same_sample_other_seed_other_sample():
    for task in TASKS:
        a, b = make_sample(task, CTX, 900, 0.5, 3, seed=1), make_sample(task, CTX, 900, 0.5, 3, seed=1)
        assert np.array_equal(a.prompt, b.prompt) and np.array_equal(a.answer, b.answer)
        c, d = make_sample(task, CTX, 900, 0.5, 3, seed=2), make_sample(task, CTX, 900, 0.5, 4, seed=1)
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
    s = make_sample("vt", CTX, 1200, 0.2, 0)
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
    r = run_cli("probes", "passkey", "niah_single_2", "--lengths", "450", "600", "--samples", "3", "--value-tokens", "16",
                "--seed", "5", "--out", str(out), timeout=300)
    assert r.returncode == 0 and "12 probes written" in r.stdout, r.stdout + r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["task"], x["length"]) for x in rows[::3]] == [("passkey", 450), ("passkey", 600), ("niah_single_2", 450), ("niah_single_2", 600)]
    assert [x["depth"] for x in rows[:3]] == [0.0, 0.5, 1.0]
    tok = ByteTokenizer()
    for x in rows:  # exact length in tokens, ending with its answer of >= 16 tokens
        assert len(tok.encode(x["text"])) == x["length"] and x["text"].endswith(x["answer"]) and len(tok.encode(x["answer"])) >= 16
    bad = run_cli("probes", "passkee", "--lengths", "300", "--out", str(tmp_path / "x.jsonl"), timeout=300)
    assert bad.returncode != 0 and "tasks: ['passkee'] not among" in bad.stderr and not (tmp_path / "x.jsonl").exists()
    short = run_cli("probes", "niah_single_2", "--lengths", "300", "--out", str(tmp_path / "y.jsonl"), timeout=300)
    assert short.returncode != 0 and "--lengths: 300 tokens is too short" in short.stderr and not (tmp_path / "y.jsonl").exists()
