"""Head-wise hybrid attention (``H``, kinds/headwise.py): the split set in ``model.headwise`` and recorded per head;
every head within its own window on every attention backend (against the per-head oracle, naive_attention.py);
all heads full is a full-attention layer and all windowed an SWA layer, exactly; pieces give the full forward; the
counts, the memory estimate, retrieval-head scoring, training, analysis and export handle it."""

import dataclasses
import json
import sys

import pandas as pd
import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from hybrid_lightning.config import validate_config
from hybrid_lightning.kinds import spec_from_dict
from hybrid_lightning.plan import build_model
from hybrid_lightning.plan.count import count
from naive_attention import naive_attention, naive_headwise_attention

W = 5
MODEL = {"n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "window": W, "vocab_size": 20}
# aligned with the key/value groups of 2 heads; out of head order; three heads of one kind (one key/value head copied)
SPLITS = ["FFSS", "SFFS", "FFFS"]


def headwise(heads: str, backend: str = "auto", **model):
    torch.manual_seed(0)
    return build_model(MODEL | {"pattern": "HF", "headwise": {"heads": heads}, "attn_backend": backend} | model)


def windows(heads: str) -> list[int | None]:
    return [None if h == "F" else W for h in heads]


def qkv(Tq: int, Tk: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(Tq * 100 + Tk)
    q = torch.randn(2, 4, Tq, 8, generator=g, dtype=dtype)
    k, v = (torch.randn(2, 2, Tk, 8, generator=g, dtype=dtype) for _ in range(2))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_()


def test_the_split_is_set_in_its_section_and_recorded_per_head_in_the_plan():
    spec = build_model(MODEL | {"pattern": "HF"}).plan[0]
    assert (spec.mixer, spec.letter, spec.window, spec.options.heads) == ("headwise", "H", W, "FFSS")  # half full
    assert build_model(MODEL | {"pattern": "HF", "headwise": {"full_heads": 1}}).plan[0].options.heads == "FSSS"
    spec = headwise("SFSF").plan[0]
    assert spec.options.heads == "SFSF" and spec.options.head_windows(W) == (W, None, W, None)
    assert spec_from_dict(json.loads(json.dumps(dataclasses.asdict(spec)))) == spec  # plan.json's round trip
    assert build_model(MODEL | {"pattern": "E", "mixer": "headwise", "n_layers": 1}).plan[0].mixer == "headwise"
    for bad, key in [({"full_heads": 2, "heads": "FFSS"}, "not both"), ({"full_heads": 5}, "full_heads=5"),
                     ({"heads": "FSF"}, "heads='FSF'"), ({"heads": "FSXS"}, "heads='FSXS'")]:
        with pytest.raises(ValueError, match=f"model.headwise.*{key}"):
            validate_config({"model": MODEL | {"pattern": "HF", "headwise": bad}})


def check_against_the_oracle(heads: str, backend: str, Tq: int = 23, past: int = 0, doc_ids=None, tol=1e-5):
    """The layer's attention on ``backend`` against the per-head oracle: outputs and gradients."""
    q, k, v = qkv(Tq, Tq + past)
    out = headwise(heads, backend).layers[0].mixer.attend(q, k, v, doc_ids)
    ref = naive_headwise_attention(q, k, v, windows(heads), doc_ids)
    assert (out - ref).abs().max() <= tol
    grad = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        assert (a - b).abs().max() <= tol


@pytest.mark.parametrize("backend", ["reference", "sdpa", "blocked"])
@pytest.mark.parametrize("heads", SPLITS)
def test_each_head_attends_within_its_own_window_on_the_cpu_backends(backend, heads):
    check_against_the_oracle(heads, backend)
    check_against_the_oracle(heads, backend, Tq=6, past=9)  # queries after cached keys
    doc_ids = torch.tensor([[0] * 9 + [1] * 14, [0] * 20 + [1] * 3])
    check_against_the_oracle(heads, backend, doc_ids=doc_ids)  # packed documents


def test_the_oracle_gives_each_head_its_own_window_by_hand():
    """Zero queries and keys weigh the visible keys equally; value j is the j-th unit vector, so an output row
    holds each key's weight: a windowed head (W=3) puts 1/3 on the last three keys, a full head 1/6 on all six."""
    q = torch.zeros(1, 2, 6, 6)
    v = torch.eye(6).expand(1, 1, 6, 6)
    out = naive_headwise_attention(q, q[:, :1], v, [3, None])  # (1, 2, 6, 6)
    assert out[0, 0, 5].tolist() == pytest.approx([0, 0, 0, 1 / 3, 1 / 3, 1 / 3])
    assert out[0, 1, 5].tolist() == pytest.approx([1 / 6] * 6)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("heads", SPLITS)
def test_flex_on_cpu_forward_matches_the_oracle(monkeypatch, heads):
    """FlexAttention runs forward-only on CPU, here without torch.compile (same masks, unfused)."""
    monkeypatch.setattr("hybrid_lightning.model.attention._compiled_flex", lambda: flex_attention)
    with torch.no_grad():
        for Tq, past in ((23, 0), (6, 9)):
            q, k, v = (t.detach() for t in qkv(Tq, Tq + past))
            out = headwise(heads, "flex").layers[0].mixer.attend(q, k, v, None)
            assert (out - naive_headwise_attention(q, k, v, windows(heads))).abs().max() <= 1e-5


@pytest.mark.parametrize("heads", SPLITS)
def test_the_flash_calls_on_head_slices_follow_flash_attns_interface(monkeypatch, heads):
    """flash-attn needs CUDA: its calls on the layer's head slices (strided views, GQA or per-head key copies) are
    checked on CPU against a stand-in with flash-attn's documented semantics (test_documents.py), in fp64."""
    from test_documents import _fake_flash_attn

    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash_attn())
    monkeypatch.setattr("hybrid_lightning.model.attention.check_backend", lambda *args: None)
    q, k, v = qkv(23, 30, torch.float64)
    out = headwise(heads, "flash").layers[0].mixer.attend(q, k, v, None)
    ref = naive_headwise_attention(q, k, v, windows(heads))
    assert (out - ref).abs().max() <= 1e-12
    grad = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        assert (a - b).abs().max() <= 1e-12


def test_the_per_head_oracle_tells_the_windows_apart():
    """A split read the wrong way round (each head in the other's window) is caught."""
    q, k, v = qkv(23, 23)
    out = headwise("FSFS").layers[0].mixer.attend(q, k, v, None)
    assert (out - naive_headwise_attention(q, k, v, windows("SFSF"))).abs().max() > 0.1
    assert (out - naive_attention(q, k, v, W)).abs().max() > 0.1


@pytest.mark.parametrize("heads, pattern", [("FFFF", "FF"), ("SSSS", "SF")])
def test_all_heads_full_is_a_full_layer_and_all_windowed_an_swa_layer_exactly(heads, pattern):
    mine = headwise(heads)
    other = build_model(MODEL | {"pattern": pattern})
    other.load_state_dict(mine.state_dict())  # the same weights, under the same names
    x = torch.randint(0, 20, (2, 17), generator=torch.Generator().manual_seed(1))
    y_mine, y_other = mine(x), other(x)
    assert torch.equal(y_mine, y_other)
    y_mine.square().sum().backward()
    y_other.square().sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(mine.parameters(), other.parameters()))


@pytest.mark.parametrize("heads", ["SFFS", "SSSS"])
def test_pieces_and_single_tokens_give_the_full_forward(heads):
    """The KV cache keeps every key where a head is full, the last W-1 where all are windowed."""
    model = headwise(heads).eval()
    x = torch.randint(0, 20, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(x)
        states = model.new_states()
        pieces = torch.cat([model(x[:, a:b], states) for a, b in ((0, 7), (7, 8), (8, 21), (21, 30))], dim=1)
        states = model.new_states()
        tokens = torch.cat([model(x[:, t : t + 1], states) for t in range(30)], dim=1)
    torch.testing.assert_close(pieces, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tokens, full, rtol=1e-5, atol=1e-5)
    assert states[0]["k"].shape[2] == (30 if "F" in heads else W - 1)


def test_parameters_are_attentions_and_flops_count_each_head_in_its_window():
    """Half the heads full: the FLOPs per token are the mean of a full and an SWA layer's, at any length."""
    plans = {p: build_model(MODEL | {"pattern": p}) for p in ("HF", "FF", "SF")}
    counts = {p: count(m.opts, m.plan, (3, 64)) for p, m in plans.items()}
    assert counts["HF"].layers == counts["FF"].layers == counts["SF"].layers
    for T in (3, 64):
        assert counts["HF"].flops[T] == pytest.approx((counts["FF"].flops[T] + counts["SF"].flops[T]) / 2, rel=1e-12)
    assert counts["SF"].flops[64] < counts["HF"].flops[64] < counts["FF"].flops[64]


def test_the_run_plan_counts_it_and_estimates_its_memory():
    from hybrid_lightning.plan.resolve import param_table, plan_run

    def planned(pattern):
        train = {"batch_size": 2, "seq_len": 64, "accelerator": "cpu"}
        return plan_run(validate_config({"model": MODEL | {"pattern": pattern, "vocab_size": None},
                                         "train": train}), sources=False)[1]

    plans = {p: planned(p) for p in ("HF", "FF", "SF")}
    assert [layer.mixer for layer in plans["HF"].layers] == ["headwise", "full"]
    assert plans["HF"].layers[0].options["heads"] == "FFSS"
    assert plans["HF"].params == plans["FF"].params and "headwise" in param_table(plans["HF"])
    assert plans["HF"].kernels["attention"] == {"headwise": "blocked", "full": "sdpa"}
    acts = {p: plan.memory["activations"] for p, plan in plans.items()}
    assert 0.9 * min(acts["FF"], acts["SF"]) <= acts["HF"] <= 1.5 * max(acts["FF"], acts["SF"]), acts


def test_retrieval_scores_each_head_in_its_own_window():
    from hybrid_lightning.heads.retrieval import head_probs, head_reach

    q, k, _ = qkv(4, 20)  # the queries at positions 16 ... 19
    probs = head_probs(q.detach(), k.detach(), (None, W, W, None))  # (2, 4, 4, 20)
    assert (probs[:, [1, 2], :, : 16 - W + 1] == 0).all() and (probs[:, [1, 2], -1, -W:] > 0).all()
    assert (probs[:, [0, 3], :, :17] > 0).all()
    valid = torch.ones(2, 4, dtype=torch.bool)
    source = torch.zeros(2, 4, 20, dtype=torch.bool)
    source[..., 2] = True  # every answer row copies from position 2: out of a window of 5
    assert head_reach(valid, source, (None, W, W, None)).sum(-1).tolist() == [[4, 0, 0, 4]] * 2


def test_retrieval_heads_records_each_heads_window_and_reach():
    """Scored on probes whose needle lies hundreds of tokens back: a windowed head (W=5) never reaches the copy
    source, a full head of the same layer always does."""
    from hybrid_lightning.data.tokenizer import ByteTokenizer
    from hybrid_lightning.heads.retrieval import RetrievalHeads

    tok = ByteTokenizer()
    held_out = tok.encode(open(torch.__file__).read() * 4)
    probe = {"tasks": ["niah_single_1"], "lengths": [600], "depths": [0.5], "samples": 1}
    cfg = validate_config({"eval": {**probe, "value_tokens": 16, "position_sequences": 0,
                                    "heads": {**probe, "echo": False}}}).eval
    model = headwise("SFFS", d_model=32, vocab_size=257).eval()
    rows = [r for r in RetrievalHeads(cfg, tok, held_out).run(model, step=0, tokens=0)["heads"] if r["layer"] == 0]
    assert [(r["mixer"], r["window"]) for r in rows] == [("headwise", W), ("headwise", None), ("headwise", None),
                                                        ("headwise", W)]
    assert [r["reach_steps"] > 0 for r in rows] == [False, True, True, False] and rows[0]["answer_steps"] > 0


def test_an_export_gives_the_native_logits_and_generation(tmp_path):
    """The transformers folder carries the kind (its definition and module) and computes what the package does,
    its KV cache through generation too."""
    transformers = pytest.importorskip("transformers", reason="the export extra (transformers) is not installed")
    from hybrid_lightning.data.tokenizer import ByteTokenizer
    from hybrid_lightning.export.folder import write_folder

    model = headwise("SFFS", vocab_size=257).eval()
    write_folder(model, ByteTokenizer(), tmp_path)
    assert (tmp_path / "hl_kinds_headwise.py").is_file() and (tmp_path / "hl_mixers_headwise.py").is_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True).eval()
    ids = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids), rtol=0, atol=1e-5)
        steps = [model(ids)[:, -1:].argmax(-1)]
        states = model.new_states()
        model(ids, states)
        for _ in range(7):  # greedy with the native KV cache
            steps.append(model(steps[-1], states)[:, -1:].argmax(-1))
    generated = hf.generate(ids, max_new_tokens=8, do_sample=False)[:, 20:]
    assert torch.equal(generated, torch.cat(steps, dim=1))


def toy_run_config() -> dict:
    return {
        "name": "hw",
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "pattern": "HF", "window": 16},
        "data": {"max_tokens": 200_000},
        "train": {"max_steps": 4, "batch_size": 2, "seq_len": 64, "warmup_steps": 1, "log_every_n_steps": 2,
                  "val_every_n_steps": 4, "val_batches": 1, "checkpoint_every_n_steps": 4, "progress_bar": False},
        "eval": {"every_n_steps": 0, "tasks": ["passkey"], "lengths": [320], "depths": [0.5], "position_sequences": 0,
                 "heads": {"every_n_steps": 0, "tasks": ["passkey"], "lengths": [320], "depths": [0.5],
                           "value_tokens": None, "samples": 1}},
    }


@pytest.mark.slow
def test_a_headwise_hybrid_trains_is_scored_per_head_analysed_and_exported(tmp_path):
    """End to end (about 15 s of CPU): 4 training steps, the evaluation callbacks at the end, analysis's label,
    and the export of the checkpoint."""
    from hybrid_lightning.analysis.report import analyze
    from hybrid_lightning.training.run import train

    run_dir = train(validate_config(toy_run_config()), tmp_path / "runs" / "hw")
    heads = json.loads((run_dir / "eval" / "heads_step_4.json").read_text())["heads"]
    assert [(h["mixer"], h["window"]) for h in heads if h["layer"] == 0] == [("headwise", None)] * 2 + [
        ("headwise", 16)] * 2
    assert {h["window"] for h in heads if h["layer"] == 1} == {None}
    analyze(tmp_path / "runs", tmp_path / "analysis")
    assert pd.read_csv(tmp_path / "analysis" / "runs.csv")["label"].tolist() == ["headwise W=16 EF"]

    transformers = pytest.importorskip("transformers", reason="the export extra (transformers) is not installed")
    from hybrid_lightning.export.folder import export_run, load_native
    from hybrid_lightning.plan.resolve import read_run

    folder = export_run(run_dir, tmp_path / "hf_headwise")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    native, _ = load_native(*read_run(run_dir), run_dir / "checkpoints" / "last.ckpt")
    x = torch.randint(0, 257, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, native(x), rtol=0, atol=1e-5)
