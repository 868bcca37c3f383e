"""Retrieval heads by attention mass and their tracing (heads/mass.py, heads/tracing.py) on a constructed model whose
answers are known: head 0 of its attention layer attends only to the needle token (mass 1, entropy 0), head 1
uniformly over every key it sees (mass 1/(keys), normalised entropy 1)."""

import copy
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from hybrid_lightning.data.tokenizer import ByteTokenizer
from hybrid_lightning.heads.mass import (
    entropies,
    mass_scores,
    needle_positions,
    qk_distances,
    read_niah,
    target_heads,
)
from hybrid_lightning.plan import build_model

NEEDLE = "7"
PROMPT = "a" * 20 + NEEDLE + "a" * 30  # the needle at position 20 of 51 tokens


@torch.no_grad()
def constructed():
    """Layer 0 full NoPE attention (2 heads, 1 KV head, Dh 8), layer 1 Lightning. Every token embeds as e1, the
    needle as e0; head 0's query reads e1 and its key e0 with a large gain; head 1's query is zero."""
    model = build_model({"n_layers": 2, "d_model": 16, "n_heads": 2, "n_kv_heads": 1, "pattern": "FL",
                         "pos": {"full": "nope"}, "recurrent_chunk": 16}).eval()
    model.embed.weight.zero_()
    model.embed.weight[:, 1] = 1.0
    model.embed.weight[ord(NEEDLE)] = 0.0
    model.embed.weight[ord(NEEDLE), 0] = 1.0
    mixer = model.layers[0].mixer
    mixer.wq.weight.zero_()
    mixer.wk.weight.zero_()
    mixer.wq.weight[0, 1] = 50.0  # head 0, first query channel <- e1
    mixer.wk.weight[0, 0] = 50.0  # the only KV head, first key channel <- e0
    return model


def samples(tmp_path, rows):
    path = tmp_path / "niah.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_niah(path, ByteTokenizer())


def test_a_head_forced_onto_the_needle_has_mass_one_and_entropy_zero(tmp_path):
    model = constructed()
    data = samples(tmp_path, [{"input": PROMPT, "outputs": [NEEDLE]}, {"input": PROMPT + "a", "outputs": NEEDLE}])
    scores, used = mass_scores(model, data)
    assert used == 2 and scores.shape == (2, 2) and np.isnan(scores[1]).all()  # Lightning: not attention
    assert scores[0, 0] == pytest.approx(1.0, abs=1e-6)
    # the query at len - 2 sees len - 1 keys, one of them the needle: 1/50 and 1/51 for the uniform head
    assert scores[0, 1] == pytest.approx((1 / 50 + 1 / 51) / 2, rel=1e-5)
    assert target_heads(scores, k=1) == [(0, 0)] and target_heads(scores) == [(0, 0), (0, 1)]
    ent = entropies(model, data, [(0, 0), (0, 1)])
    assert ent[(0, 0)][0] == pytest.approx(0.0, abs=1e-6)
    assert ent[(0, 1)][1] == pytest.approx(1.0, abs=1e-6)
    queries = [p + 1 for n in (51, 52) for p in range(n - 4, n)]
    assert ent[(0, 1)][0] == pytest.approx(np.mean([math.log(k) for k in queries]), rel=1e-6)


def test_samples_without_their_needle_are_left_out_of_the_mass_but_not_of_the_entropy(tmp_path):
    model = constructed()
    data = samples(tmp_path, [{"input": PROMPT, "outputs": ["9"]}, {"input": PROMPT, "outputs": [NEEDLE]}])
    assert mass_scores(model, data)[1] == 1
    with pytest.raises(ValueError, match="needle was found"):
        mass_scores(model, data[:1])
    with pytest.raises(ValueError, match="'input'"):
        samples(tmp_path, [{"prompt": PROMPT, "outputs": [NEEDLE]}])


def test_needle_positions_cover_every_occurrence_in_every_form():
    tok = ByteTokenizer()
    text = "x: 42. y 42 z 421"
    found = needle_positions(np.asarray(tok.encode(text)), ["42"], tok)
    assert found.tolist() == [1, 2, 3, 4, 5, 8, 9, 10, 13, 14, 15]  # ": 42.", " 42", " 42" of " 421"
    assert needle_positions(np.asarray(tok.encode("abc")), ["42"], tok).tolist() == []


def test_qk_distance_is_the_norm_of_the_heads_rows_and_its_kv_group():
    model = constructed()
    reference = copy.deepcopy(model)
    with torch.no_grad():
        model.layers[0].mixer.wq.weight[8:16] += 0.5  # head 1's query rows (Dh 8 x D 16)
        model.layers[0].mixer.wk.weight[:8] += 0.25  # the KV head both heads share
    d = qk_distances(model, reference, [(0, 0), (0, 1)])
    assert d[(0, 0)]["q_l2"] == pytest.approx(0.0, abs=1e-6)
    assert d[(0, 1)]["q_l2"] == pytest.approx(0.5 * math.sqrt(8 * 16), rel=1e-6)
    assert d[(0, 0)]["k_l2"] == d[(0, 1)]["k_l2"] == pytest.approx(0.25 * math.sqrt(128), rel=1e-6)
    assert d[(0, 0)]["k_rel_l2"] == pytest.approx(0.25 * math.sqrt(128) / 50.0, rel=1e-6)  # the reference's norm: 50
    assert math.isinf(d[(0, 1)]["q_rel_l2"]) or d[(0, 1)]["q_rel_l2"] > 1e9  # its reference rows are 0 (+ eps)
    assert d[(0, 1)]["qk_l2"] == pytest.approx(d[(0, 1)]["q_l2"] + d[(0, 1)]["k_l2"])


@pytest.mark.slow
def test_trace_chooses_the_final_checkpoints_heads_and_traces_them_back(tmp_path, capsys):
    """A tiny run with checkpoints at steps 2 and 4: ``trace`` picks the top 2 heads at step 4 and writes both
    steps' records (Q/K distances 0 at the reference, step 2) and TensorBoard scalars; a bad head is refused."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from conftest import TINY
    from hybrid_lightning.cli import main

    run_dir = tmp_path / "run"
    settings = {"train.max_steps": 4, "train.checkpoint_every_n_steps": 2, "train.keep_checkpoints": -1,
                "train.warmup_steps": 1, "eval.every_n_steps": 0, "eval.at_end": "false",
                "eval.heads.every_n_steps": 0, "eval.heads.at_end": "false"}
    overrides = [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    assert main(["train", "--run-dir", str(run_dir), *TINY, *overrides]) == 0
    niah = tmp_path / "niah.jsonl"
    niah.write_text("".join(json.dumps({"input": f"key {v}: x. " * 3 + "The key is", "outputs": [str(v)]}) + "\n"
                            for v in (314, 2718)))
    assert main(["trace", str(run_dir), "--niah", str(niah), "--top", "2"]) == 0
    assert "qk_rel_l2" in capsys.readouterr().out
    first, last = (json.loads((run_dir / "tracing" / f"step_{s}.json").read_text()) for s in (2, 4))
    chosen = target_heads(np.array([[r["mass"] for r in last["mass"] if r["layer"] == 1]]), k=2)
    assert [(r["layer"], r["head"]) for r in last["trace"]] == [(1, h) for _, h in chosen]  # the full layer's
    assert [r["target"] for r in first["mass"]] == [r["target"] for r in last["mass"]]
    assert first["reference_step"] == 2 and all(r["qk_l2"] == 0 for r in first["trace"])
    assert all(r["qk_l2"] > 0 for r in last["trace"]) and last["samples_used"] == 2
    acc = EventAccumulator(str(run_dir / "tracing")).Reload()
    assert [e.step for e in acc.Scalars("tracing/entropy_norm")] == [2, 4]
    assert main(["trace", str(run_dir), "--niah", str(niah), "--heads", "0.5"]) == 2
    assert "not an attention head" in capsys.readouterr().err


def test_the_initialisation_is_the_model_training_starts_from(tmp_path):
    """``initialisation`` rebuilds the model ``build_trainer`` makes after seeding, weight for weight, and leaves the
    global random state as it was."""
    from hybrid_lightning.config import load_config
    from hybrid_lightning.heads.tracing import initialisation
    from hybrid_lightning.plan.resolve import plan_run
    from hybrid_lightning.training.trainer import build_trainer

    cfg = load_config(None, ["seed=7", "model.pattern=EF", "model.n_layers=2", "model.d_model=32", "model.n_heads=2",
                             "train.max_steps=4", "train.warmup_steps=1", "train.seq_len=64", "train.batch_size=2"])
    cfg, plan = plan_run(cfg, sources=False)
    _, module, _ = build_trainer(cfg, plan, tmp_path / "run")
    before = torch.random.get_rng_state()
    rebuilt = initialisation(plan, cfg.seed).state_dict()
    assert torch.equal(before, torch.random.get_rng_state())
    assert all(torch.equal(w, rebuilt[k]) for k, w in module.model.state_dict().items())


def test_heads_traced_during_training_are_their_checkpoints_traced_again(tmp_path, capsys):
    """``eval.trace`` every 5 steps of a 10-step run: eval/trace_step_5.json and _10.json with each step's top 2 heads
    (the full layer's), Q/K distances to the initialisation growing, TensorBoard scalars under val_longctx_trace/;
    the step-10 record equals ``live_trace`` recomputed from the checkpoint; analyze draws it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from conftest import TINY
    from hybrid_lightning.analysis.report import analyze
    from hybrid_lightning.cli import main
    from hybrid_lightning.eval.offline import load_checkpoint
    from hybrid_lightning.heads.tracing import initialisation, live_trace, trace_samples

    run_dir = tmp_path / "run"
    settings = {"train.max_steps": 10, "train.warmup_steps": 1, "eval.every_n_steps": 0, "eval.at_end": "false",
                "eval.heads.every_n_steps": 0, "eval.heads.at_end": "false", "eval.trace.every_n_steps": 5,
                "eval.trace.samples": 3, "eval.trace.top": 2}
    assert main(["train", "--run-dir", str(run_dir), *TINY, *[a for k, v in settings.items()
                                                              for a in ("--set", f"{k}={v}")]]) == 0
    five, ten = (json.loads((run_dir / "eval" / f"trace_step_{s}.json").read_text()) for s in (5, 10))
    assert ten["final_step"] == 10 and ten["reference_step"] == 0 and ten["samples"] == 3 and len(ten["trace"]) == 2
    assert {r["layer"] for r in ten["trace"]} == {1}  # TINY is EF: the full layer's heads
    assert 0 < np.mean([r["qk_l2"] for r in five["trace"]]) < np.mean([r["qk_l2"] for r in ten["trace"]])
    run = load_checkpoint(run_dir, None, [], None)
    again = live_trace(run.model.eval(), initialisation(run.plan, run.cfg.seed),
                       trace_samples(run.cfg.eval, run.data.tokenizer, run.data.val_tokens), 2, step=10,
                       tokens=ten["tokens"])
    for part in ("mass", "trace"):
        for a, b in zip(ten[part], again[part], strict=True):
            assert a.keys() == b.keys() and all(a[k] == (pytest.approx(b[k], rel=1e-5, abs=1e-7)
                                                         if isinstance(a[k], float) else b[k]) for k in a), (a, b)
    acc = EventAccumulator(str(run_dir)).Reload()
    assert [e.step for e in acc.Scalars("val_longctx_trace/qk_rel_l2")] == [5, 10]
    analyze(run_dir, tmp_path / "report")
    rows = pd.read_csv(tmp_path / "report" / "diagnostics_trace.csv")
    assert set(rows["source"]) == {"live"} and sorted(set(rows["step"])) == [5, 10]
    assert (tmp_path / "report" / "tracing.png").is_file()
