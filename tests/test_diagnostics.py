"""The paper's diagnostics on tiny constructed models whose answers are known: gradient influence
(eval/gradient.py) and layer-wise probes (eval/layer_probe.py)."""

import json

import numpy as np
import pytest
import torch

from hybrid_lightning.data.tokenizer import ByteTokenizer
from hybrid_lightning.eval.gradient import TARGET_LAST, influence_curve, read_texts
from hybrid_lightning.eval.layer_probe import HARD_VALUES, accuracy, features, last_token_states, make_probe_set
from hybrid_lightning.model.restrict import receptive_field
from hybrid_lightning.probes.haystack import NOISE
from test_model import tiny


def texts(*lengths: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 50, n) for n in lengths]


def test_a_model_without_mixing_is_influenced_by_the_last_20_tokens_alone():
    """With every mixer and MLP output zeroed, the logits at t read token t only: the target's gradient is
    (1/20) d/de sum_v lm_head(norm(e)) at each of the last 20 embeddings, and 0 further back."""
    model = tiny("EF", mixer="swa")
    for block in model.layers:
        torch.nn.init.zeros_(block.mixer.wo.weight)
        torch.nn.init.zeros_(block.mlp.w2.weight)
    (ids,) = texts(30)
    curve = influence_curve(model, [ids], context=32)
    e = model.embed(torch.from_numpy(ids[::-1].copy())).detach().requires_grad_(True)  # (30, D), distance order
    expected = torch.autograd.grad(model.lm_head(model.norm(e)).sum() / TARGET_LAST, e)[0].norm(dim=-1).numpy()
    np.testing.assert_allclose(curve.mean[:TARGET_LAST], expected[:TARGET_LAST], rtol=1e-6)
    assert (curve.mean[TARGET_LAST:30] == 0).all() and np.isnan(curve.mean[30:]).all()
    assert curve.counts.tolist() == [1] * 30 + [0] * 2


def test_influence_ends_where_the_windows_reach():
    """SWA (W = 4) then full attention limited to R = 5: the last 20 positions reach 19 + 3 + 4 tokens back."""
    model = tiny("EF", mixer="swa", window=4)
    ids = texts(40, 40, 35)
    free = influence_curve(model, ids, context=40)
    with receptive_field(model, "full", 5):
        limited = influence_curve(model, ids, context=40)
    reach = TARGET_LAST - 1 + 3 + 4
    assert (limited.mean[reach + 1 :] == 0).all() and (limited.mean[: reach + 1] > 0).all()
    assert (free.mean > 0).all()
    assert free.counts.tolist() == [3] * 35 + [2] * 5  # the shorter text reaches 35 distances


def test_texts_read_as_the_authors_script_reads_them(tmp_path):
    rows = [{"input": "first"}, {"text": "second", "prompt": ""}, {"other": "x"}, {"context": "third"}]
    (tmp_path / "t.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n\n")
    assert read_texts(tmp_path / "t.jsonl", 10) == ["first", "second", "third"]
    assert read_texts(tmp_path / "t.jsonl", 2) == ["first", "second"]
    (tmp_path / "t.txt").write_text(" a \n\nb\n")
    assert read_texts(tmp_path / "t.txt", 10) == ["a", "b"]
    with pytest.raises(ValueError, match="--texts"):
        read_texts(tmp_path / "t.json", 1)


def test_layer_features_are_the_blocks_outputs_at_the_last_token():
    model = tiny("EEF", mixer="lightning").float()
    (ids,) = texts(23)
    x = model.embed(torch.from_numpy(ids)[None])
    expected = [x[0, -1]]
    for block in model.layers:
        x = block(x)
        expected.append(x[0, -1])
    whole = last_token_states(model, torch.from_numpy(ids), chunk=100)
    torch.testing.assert_close(whole, torch.stack(expected), rtol=0, atol=1e-6)
    pieces = features(model, [ids], chunk=5)[0]  # fed in pieces through the states
    np.testing.assert_allclose(pieces, whole.detach().numpy(), rtol=0, atol=1e-5)


def test_the_probe_reads_a_layer_that_holds_the_label_and_not_one_that_does_not():
    rng = np.random.default_rng(0)
    y = np.arange(200) % 8
    holds = np.eye(8)[y] * 8 + rng.normal(size=(200, 8))
    noise = rng.normal(size=(200, 8))
    assert accuracy(holds, y) == (1.0, 160, 40)  # an 80/20 split, stratified
    assert accuracy(noise, y)[0] < 0.4


def test_probe_prompts_fit_their_length_and_carry_their_label():
    tok = ByteTokenizer()
    rows = make_probe_set(tok, 20, 1000, classes=4, seed=3)
    for r in rows:
        ids = tok.encode(r["text"])
        assert len(ids) <= 1000 and r["value"] == HARD_VALUES[r["label"]] and 0 <= r["label"] < 4
        lines = r["text"].split("\n")[1:-1]  # the haystack, one block or needle per line
        at = next(i for i, line in enumerate(lines) if r["value"] in line)
        assert f"for {r['key']} is: {r['value']}." in lines[at] and (len(lines) - 1) // 4 <= at
        assert at <= 3 * (len(lines) - 1) // 4 and r["text"].endswith(f"for {r['key']} mentioned in the provided "
                                                                         "text is")
    assert rows == make_probe_set(tok, 20, 1000, classes=4, seed=3)
    with pytest.raises(ValueError, match="--classes"):
        make_probe_set(tok, 1, 1000, classes=9)


def test_a_brief_probe_is_their_needle_and_haystack_within_a_short_context():
    """At 512 byte tokens their prompt cannot hold 4 noise blocks (refused, naming --brief); the brief prompt holds
    4 or more, with their needle, values and labels in the same places, and ends on the needle restated up to the
    digit that tells the 8 values apart."""
    tok = ByteTokenizer()
    with pytest.raises(ValueError, match="--brief"):
        make_probe_set(tok, 1, 512)
    theirs, brief = make_probe_set(tok, 20, 1000, seed=3), make_probe_set(tok, 20, 512, seed=3, brief=True)
    for t, b in zip(theirs, brief):
        assert len(tok.encode(b["text"])) <= 512 and b["text"].count(NOISE) >= 4
        assert (b["label"], b["value"], b["key"]) == (t["label"], t["value"], t["key"])
        assert f"for {b['key']} is: {b['value']}." in b["text"]
        assert b["text"].endswith(f"\nThe magic number for {b['key']} is: 3141592") and "quiz" not in b["text"]
