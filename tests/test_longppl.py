"""LongPPL as Fang et al.: one evaluator model chooses the key tokens, so two models are scored on the
same tokens; a model that is its own evaluator gives the self-selected LongPPL; without an evaluator
LongPPL is not reported; key tokens are cached per evaluator checkpoint and evaluation set."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TINY, run_cli
from hybrid_lightning import build_model
from hybrid_lightning.config import dump_config, load_config, validate_config
from hybrid_lightning.data.tokenizer import ByteTokenizer
from hybrid_lightning.eval import longppl
from hybrid_lightning.eval.longppl import evaluator_key_tokens, select_key_tokens
from hybrid_lightning.eval.report import scalars, table
from hybrid_lightning.eval.runner import LongContextEval
from hybrid_lightning.eval.scoring import short_context_nll, token_nll
from hybrid_lightning.rundir import CKPT_DIR, CONFIG_FILE, LAST_CKPT
from hybrid_lightning.rundir.status import write_status

TOK = ByteTokenizer()
HELD_OUT = TOK.encode(open(np.__file__.replace("__init__.py", "_core/numeric.py")).read())
# alpha 0, beta -10: every token that the long context helps at all, so untrained models have key tokens
EVAL = {"tasks": ["passkey"], "lengths": [600], "depths": [0.5], "samples": 1, "position_sequences": 3,
        "position_length": 256, "longppl_context": 32, "longppl_alpha": 0.0, "longppl_beta": -10.0, "batch_size": 2}


def run_config(tmp_path, evaluator=None, **eval_kw):
    return validate_config({"model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "window": 16,
                                      "vocab_size": TOK.vocab_size},
                            "data": {"cache_dir": str(tmp_path / "cache")},
                            "eval": {**EVAL, **eval_kw, "longppl_evaluator": evaluator}})


MODEL = {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "window": 16, "init_std": 0.3}


def model(seed: int):
    torch.manual_seed(seed)
    return build_model(MODEL).double()


def save_run(run_dir, m, done: bool = True):
    """A run directory holding ``m`` (a model of ``MODEL``) as its last checkpoint (what ``train`` leaves)."""
    (run_dir / CKPT_DIR).mkdir(parents=True)
    (run_dir / CONFIG_FILE).write_text(dump_config(validate_config({"model": {**MODEL, "vocab_size": TOK.vocab_size}})))
    torch.save({"state_dict": {f"model.{k}": v for k, v in m.state_dict().items()}, "global_step": 5},
               run_dir / CKPT_DIR / LAST_CKPT)
    write_status(run_dir, state="done" if done else "running", step=5, max_steps=5)
    return run_dir


def evaluate(cfg, m):
    ev = LongContextEval(cfg.eval, TOK, HELD_OUT, window=16)
    ev.keys = evaluator_key_tokens(cfg, ev.sequences, torch.device("cpu"))
    return ev, ev.run(m, step=0, tokens=0)


def nll_of(m, ev):
    ids = torch.from_numpy(np.stack(ev.sequences))
    return token_nll(m, ids, ev.cfg.chunk_tokens)[0].double()  # (n, T-1)


def test_two_models_are_scored_on_the_evaluators_tokens(tmp_path):
    evaluator = model(0).float()
    cfg = run_config(tmp_path, str(save_run(tmp_path / "evaluator", evaluator)))
    reports = {}
    for seed in (1, 2):
        m = model(seed)
        ev, report = evaluate(cfg, m)
        (row,) = report["longppl"]
        key = ev.keys.key
        assert key.shape == (3, 256) and 0 < key.sum() < ev.keys.key.size
        assert row["key_tokens"] == key.sum() and row["evaluator"].endswith(LAST_CKPT) and row["reason"] is None
        assert row["longppl"] == pytest.approx(math.exp(nll_of(m, ev)[torch.from_numpy(key)].mean().item()), rel=1e-9)
        own = select_key_tokens(m, ev.sequences, cfg.eval, None)
        assert not np.array_equal(own, key)  # the model would have chosen other tokens for itself
        reports[seed] = key
    assert np.array_equal(reports[1], reports[2])  # the same tokens, position for position
    assert not reports[1][:, : 2 * 32 - 1].any()  # only tokens with at least 2K context


def test_a_model_as_its_own_evaluator_gives_the_self_selected_longppl(tmp_path):
    m = model(3)
    cfg = run_config(tmp_path, str(save_run(tmp_path / "self", m)))
    ev, report = evaluate(cfg, m)
    (row,) = report["longppl"]
    # the self-selected LongPPL, computed here as before an evaluator existed
    ids = torch.from_numpy(np.stack(ev.sequences))
    nll = token_nll(m, ids, 2048)[0].double()
    short = short_context_nll(m, ids, 32, 2048, None, 2).double()
    scored = ~short.isnan()
    key = scored & (short - nll > 0.0) & (-nll > -10.0)
    assert row["key_tokens"] == key.sum().item() and row["scored_tokens"] == scored.sum().item()
    assert row["longppl"] == pytest.approx(math.exp(nll[key].mean().item()), rel=1e-9)
    assert row["ppl"] == pytest.approx(math.exp(nll[scored].mean().item()), rel=1e-9)


def test_without_an_evaluator_longppl_is_not_reported(tmp_path):
    _, report = evaluate(run_config(tmp_path), model(1))
    (row,) = report["longppl"]
    assert row["longppl"] is None and row["key_tokens"] is None and row["evaluator"] is None
    assert "eval.longppl_evaluator is null" in row["reason"] and row["ppl"] > 1
    tags = scalars(report)
    assert ("val_longctx/longppl" not in tags and "val_longctx/key_token_share" not in tags
            and "val_longctx/ppl_long" in tags)
    assert "LongPPL not reported: no evaluator model" in table(report)
    # an evaluator still training is not used either: its newest checkpoint would change
    unfinished = save_run(tmp_path / "training", model(0), done=False)
    _, report = evaluate(run_config(tmp_path, str(unfinished)), model(1))
    assert report["longppl"][0]["longppl"] is None and "has not finished training" in report["longppl"][0]["reason"]
    _, report = evaluate(run_config(tmp_path, str(tmp_path / "nowhere")), model(1))
    assert "nowhere does not exist" in report["longppl"][0]["reason"]


def test_key_tokens_are_cached_per_evaluator_and_evaluation_set(tmp_path, monkeypatch):
    run_dir = save_run(tmp_path / "evaluator", model(0))
    cfg = run_config(tmp_path, str(run_dir / CKPT_DIR / LAST_CKPT))  # a checkpoint file names the evaluator too
    first, _ = evaluate(cfg, model(1))
    assert len(list((tmp_path / "cache" / "longppl").iterdir())) == 1

    def no_load(*args):
        raise AssertionError("the evaluator was loaded again")

    monkeypatch.setattr(longppl, "load_model", no_load)
    again, _ = evaluate(cfg, model(2))
    assert np.array_equal(again.keys.key, first.keys.key)
    with pytest.raises(AssertionError, match="loaded again"):  # another short context: another entry
        evaluate(run_config(tmp_path, str(run_dir), longppl_context=48), model(1))
    with pytest.raises(AssertionError, match="loaded again"):  # another evaluation set
        evaluate(run_config(tmp_path, str(run_dir), position_length=300), model(1))


def test_an_evaluator_with_another_vocabulary_is_refused(tmp_path):
    settings = {"n_layers": 1, "d_model": 32, "n_heads": 2, "pattern": "F", "vocab_size": 100}
    other = build_model(settings)
    run_dir = tmp_path / "other"
    (run_dir / CKPT_DIR).mkdir(parents=True)
    (run_dir / CONFIG_FILE).write_text(dump_config(validate_config({"model": settings})))
    torch.save({"state_dict": {f"model.{k}": v for k, v in other.state_dict().items()}, "global_step": 1},
               run_dir / CKPT_DIR / LAST_CKPT)
    write_status(run_dir, state="done")
    with pytest.raises(ValueError, match="eval.longppl_evaluator: .* must share the run's tokenizer"):
        evaluate(run_config(tmp_path, str(run_dir)), model(1))


@pytest.mark.slow
def test_the_callback_scores_a_run_on_its_evaluators_key_tokens(tmp_path):
    """Two training runs: the first finishes and is the second's evaluator; the second's callback
    reports LongPPL on the key tokens the first chose."""
    common = [*TINY, "--set", "train.max_steps=6", "--set", "train.warmup_steps=1", "--set", "eval.every_n_steps=0",
              "--set", "eval.tasks=[passkey]", "--set", "eval.lengths=[300]", "--set", "eval.depths=[0.5]",
              "--set", "eval.position_length=256", "--set", "eval.longppl_context=32",
              "--set", "eval.longppl_alpha=0.0",
              "--set", "eval.longppl_beta=-10.0", "--set", "eval.heads.at_end=false",
              "--set", "eval.heads.every_n_steps=0"]
    evaluator, scored = tmp_path / "evaluator", tmp_path / "scored"
    for run_dir, extra in ((evaluator, []),
                           (scored, ["--set", f"eval.longppl_evaluator={evaluator}", "--set", "seed=1"])):
        r = run_cli("train", "--run-dir", str(run_dir), *common, *extra)
        assert r.returncode == 0, r.stderr[-3000:]
    own = json.loads((evaluator / "eval" / "step_6.json").read_text())["longppl"][0]
    assert own["longppl"] is None and own["key_tokens"] is None and "no evaluator" in own["reason"]
    row = json.loads((scored / "eval" / "step_6.json").read_text())["longppl"][0]
    assert row["evaluator"] == str(evaluator / CKPT_DIR / LAST_CKPT) and row["reason"] is None
    assert row["key_tokens"] > 0 and row["longppl"] > 1


def test_a_relative_evaluator_path_is_taken_from_the_config_files_folder(tmp_path):
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "run.yaml"
    path.write_text("eval: {longppl_evaluator: ../runs/evaluator}\n")
    assert load_config(path).eval.longppl_evaluator == str(tmp_path / "runs" / "evaluator")
    assert load_config(None, ["eval.longppl_evaluator=runs/x"]).eval.longppl_evaluator == str(Path.cwd() / "runs" / "x")
