"""analysis/: tidy loading and every CSV number on fabricated run directories with known values (F1); the
report, ``analyze`` on a real tiny grid (F2) and its time (F3) are in test_analysis_report.py."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats as st
from torch.utils.tensorboard import SummaryWriter

from hybrid_lightning.analysis.load import find_runs, load_runs
from hybrid_lightning.analysis.report import analyze
from hybrid_lightning.config import config_to_dict, validate_config

TOKENS_PER_STEP = 16  # batch 2 x seq_len 8
EVAL_STEPS = (9, 19, 29, 39)  # steps of the last batch before each evaluation (tokens = (step + 1) x 16)
CHANCE_LOSS = math.log(10)  # chance token accuracy exp(-chance loss) = 0.1


def run_config(seed, window=16, pos_full="rope", pattern="EEEF", mixer="swa", n_heads=2):
    cfg = {"seed": seed, "model": {"pattern": pattern, "mixer": mixer, "window": window, "pos": {"full": pos_full},
                                   "n_heads": n_heads},
           "train": {"batch_size": 2, "seq_len": 8, "max_steps": 40, "warmup_steps": 1}}
    return {**config_to_dict(validate_config(cfg)), "provenance": {"git": "abc"}}


def fabricate(run_dir, config, state, scalars, score=(), beyond_extra=0.0, heads=(), packed=False):
    """A run directory: config.yaml, status.json, TensorBoard ``scalars`` {tag: [(step, value)]} (``packed``:
    as a packed run's scalars.csv, faster to write and read), and at
    EVAL_STEPS[i] an eval/step_<k>.json whose token accuracy minus chance is score[i] at length 8 and
    score[i] + beyond_extra at length 16 (> seq_len), and a heads file with heads[i] = (retrieval heads,
    score of head 3.0), its layers' kinds from the config's pattern and mixer and its heads per layer from
    model.n_heads; the retrieval heads are the first heads of its first full-attention layer."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    last = max((s for series in scalars.values() for s, _ in series), default=0)
    (run_dir / "status.json").write_text(json.dumps({"state": state, "step": last + 1, "max_steps": 40}))
    if packed:
        rows = [f"{step},{tag},{value!r}" for tag, series in scalars.items() for step, value in series]
        (run_dir / "scalars.csv").write_text("\n".join(["step,metric,value", *rows]) + "\n")
    else:
        writer = SummaryWriter(str(run_dir))
        for tag, series in scalars.items():
            for step, value in series:
                writer.add_scalar(tag, value, step)
        writer.close()
    (run_dir / "eval").mkdir()
    for step, acc in zip(EVAL_STEPS, score):
        tokens = (step + 1) * TOKENS_PER_STEP
        records = [{"step": step, "tokens": tokens, "task": "passkey", "length": length, "depth": depth,
                    "in_window": None, "n": 1, "accuracy": float(acc > 0.5), "answer_tokens": 2,
                    "token_accuracy": 0.1 + acc + (beyond_extra if length > 8 else 0.0), "answer_loss": 1.0,
                    "chance_token_accuracy": 0.1, "chance_loss": CHANCE_LOSS, "distance": 5.0}
                   for length in (8, 16) for depth in (0.0, 1.0)]
        (run_dir / "eval" / f"step_{step}.json").write_text(json.dumps({"step": step, "tokens": tokens, "window": 16,
                                                                         "records": records, "position_loss": [],
                                                                         "longppl": [], "score": None}))
    for step, (count, score) in zip(EVAL_STEPS, heads):
        tokens = (step + 1) * TOKENS_PER_STEP
        kinds = ["full" if letter == "F" else config["model"]["mixer"] for letter in config["model"]["pattern"]]
        first_full = kinds.index("full") if "full" in kinds else None
        rows = [{"step": step, "tokens": tokens, "layer": layer, "head": head, "mixer": kinds[layer],
                 "window": 16 if layers_swa else None, "pos": "rope",
                 "score": score if (layer, head) == (3, 0) else 0.0,
                 "retrieval": layer == first_full and head < count, "role": None}
                for layer, layers_swa in enumerate(k == "swa" for k in kinds) if kinds[layer] in ("full", "swa")
                for head in range(config["model"]["n_heads"])]
        layers = [{"step": step, "tokens": tokens, "layer": i, "mixer": k, "window": 16 if k == "swa" else None,
                   "pos": "rope", "applicable": True} for i, k in enumerate(kinds)]
        total = {"retrieval_heads": count, "copy_heads": 0, "locator_heads": 0, "max_score": score,
                 "mean_score": score / 8}
        (run_dir / "eval" / f"heads_step_{step}.json").write_text(json.dumps(
            {"step": step, "tokens": tokens, "heads": rows, "layers": layers, "total": total, "ablation": []}))


def tokens_scalars(last_step):
    return [(s, (s + 1) * TOKENS_PER_STEP) for s in range(4, last_step + 1, 5)]


@pytest.fixture(scope="module")
def fabricated(tmp_path_factory):
    """Two seeds of a W=16 RoPE and a W=16 NoPE hybrid, a W=64 run still going (one seed, up to step 19),
    an all-full run without evaluation files; a stray .grid/ folder that must be skipped."""
    root = tmp_path_factory.mktemp("fab") / "grid"
    fabricate(root / "rope-s0", run_config(0), "done",
              {"train/tokens": tokens_scalars(39), "val/loss": [(19, 3.0), (39, 2.0)],
               "val/retrieval_acc": [(19, 0.1), (39, 0.3)]},
              score=(0.0, 0.2, 0.4, 0.8), heads=((0, 0.0), (0, 0.05), (1, 0.2), (2, 0.5)))
    fabricate(root / "rope-s1", run_config(1), "done",
              {"train/tokens": tokens_scalars(39), "val/loss": [(19, 3.0), (39, 2.2)],
               "val/retrieval_acc": [(19, 0.2), (39, 0.5)]},
              score=(0.0, 0.4, 0.6, 0.6), heads=((0, 0.0), (1, 0.2), (1, 0.2), (1, 0.3)))
    fabricate(root / "nope-s0", run_config(0, pos_full="nope"), "done",
              {"train/tokens": tokens_scalars(39), "val/loss": [(39, 2.3)]},
              score=(0.0, 0.1, 0.2, 0.3), beyond_extra=0.1, heads=((0, 0.0),) * 4)
    fabricate(root / "nope-s1", run_config(1, pos_full="nope"), "done",
              {"train/tokens": tokens_scalars(39), "val/loss": [(39, 2.5)]},
              score=(0.0, 0.1, 0.2, 0.5), beyond_extra=0.1, heads=((0, 0.0), (0, 0.0), (0, 0.0), (1, 0.4)))
    fabricate(root / "w64-s0", run_config(0, window=64), "running",
              {"train/tokens": tokens_scalars(19), "val/loss": [(19, 3.1)]},
              score=(0.1, 0.3), heads=((0, 0.0), (0, 0.01)))
    fabricate(root / "full-s0", run_config(0, pattern="F"), "done",
              {"train/tokens": tokens_scalars(39), "val/loss": [(39, 1.9)]})
    (root / ".grid" / "cells" / "x").mkdir(parents=True)
    (root / ".grid" / "cells" / "x" / "config.yaml").write_text("seed: 0\n")
    out = root.parent / "out"
    analyze(root, out, workers=1)
    return root, out


def csv(out, name):
    return pd.read_csv(out / name)


def test_tidy_tables(fabricated):
    root, _ = fabricated
    runs = load_runs(find_runs(root), root=root)
    # .grid skipped
    assert sorted(runs.configs["run"]) == ["full-s0", "nope-s0", "nope-s1", "rope-s0", "rope-s1", "w64-s0"]
    labels = dict(zip(runs.configs["run"], runs.configs["label"]))
    assert labels["rope-s0"] == labels["rope-s1"] == "W=16 EEEF pos.full=rope"
    assert labels["nope-s0"] == "W=16 EEEF pos.full=nope" and labels["w64-s0"] == "W=64 EEEF pos.full=rope"
    assert labels["full-s0"] == "F pos.full=rope"
    assert (runs.configs["tokens_per_step"] == TOKENS_PER_STEP).all()
    m = runs.metrics
    assert {"run", "step", "tokens", "metric", "value", "label", "seed", "model.window", "model.pos.full",
            "model.pattern"} <= set(m.columns)
    row = m[(m["run"] == "rope-s0") & (m["metric"] == "longctx/score") & (m["step"] == 39)]
    assert (row["value"].item() == pytest.approx(0.8) and row["tokens"].item() == 640
            and row["model.pos.full"].item() == "rope")
    beyond = m[(m["run"] == "nope-s1") & (m["metric"] == "longctx/score_beyond") & (m["step"] == 39)]
    assert beyond["value"].item() == pytest.approx(0.6)
    val = m[(m["run"] == "rope-s1") & (m["metric"] == "val/loss")]
    assert val["step"].tolist() == [19, 39] and val["tokens"].tolist() == [320, 640]
    assert len(runs.heads) == 4 * 8 * 4 + 2 * 8 and set(runs.layers["mixer"]) == {"swa", "full"}


def test_emergence_csvs(fabricated):
    _, out = fabricated
    c = csv(out, "emergence_curves.csv").set_index(["label", "step"])
    rope = c.loc["W=16 EEEF pos.full=rope"]
    np.testing.assert_allclose(rope["mean"], [0.0, 0.3, 0.5, 0.7], atol=1e-9)
    np.testing.assert_allclose(rope["min"], [0.0, 0.2, 0.4, 0.6], atol=1e-9)
    np.testing.assert_allclose(rope["max"], [0.0, 0.4, 0.6, 0.8], atol=1e-9)
    np.testing.assert_allclose(rope["std"], [0.0, math.sqrt(0.02), math.sqrt(0.02), math.sqrt(0.02)], atol=1e-9)
    assert rope["tokens"].tolist() == [160, 320, 480, 640] and rope["seeds"].tolist() == [2] * 4
    assert c.loc["W=64 EEEF pos.full=rope"]["mean"].tolist() == pytest.approx([0.1, 0.3])
    t = csv(out, "emergence_thresholds.csv").set_index("label")
    assert (t.loc["W=16 EEEF pos.full=rope", ["final", "final_min", "final_max"]].tolist()
            == pytest.approx([0.7, 0.6, 0.8]))
    # 50% of 0.7 = 0.35: first reached at step 29 (mean 0.5); 90% = 0.63 at step 39
    assert (t.loc["W=16 EEEF pos.full=rope", ["tokens_50", "step_50", "tokens_90", "step_90"]].tolist()
            == [480, 29, 640, 39])
    # NoPE: means 0, 0.1, 0.2, 0.4 within the training length (length 16, beyond it, is not in the score):
    # 50% of 0.4 first reached at step 29, 90% at 39
    assert t.loc["W=16 EEEF pos.full=nope", "final"] == pytest.approx(0.4)
    assert t.loc["W=16 EEEF pos.full=nope", ["tokens_50", "tokens_90"]].tolist() == [480, 640]
    assert (t.loc["W=64 EEEF pos.full=rope", ["seeds", "final_step", "tokens_50", "tokens_90"]].tolist()
            == [1, 19, 320, 320])
    assert "F pos.full=rope" not in t.index  # no evaluation files


def test_laziness_csvs(fabricated):
    _, out = fabricated
    first = csv(out, "first_heads.csv").set_index("run")
    assert first.loc["rope-s0", ["first_step", "first_tokens", "window", "scored_until"]].tolist() == [29, 480, 16, 39]
    assert first.loc["rope-s1", ["first_step", "first_tokens"]].tolist() == [19, 320]
    assert first.loc["nope-s1", "first_step"] == 39 and np.isnan(first.loc["nope-s0", "first_step"])
    assert np.isnan(first.loc["w64-s0", "first_step"]) and first.loc["w64-s0", "window"] == 64
    by = csv(out, "first_heads_by_arch.csv").set_index("label")
    rope = by.loc["W=16 EEEF pos.full=rope"]
    assert rope[["runs", "runs_with_head", "first_step_mean", "first_step_min", "first_step_max",
                 "first_tokens_mean"]].tolist() == [2, 2, 24, 19, 29, 400]
    ci = st.ttest_1samp([19, 29], 0).confidence_interval()  # the t interval of seeds 19 and 29
    assert rope[["first_step_ci_low", "first_step_ci_high"]].tolist() == pytest.approx([ci.low, ci.high])
    assert by.loc["W=16 EEEF pos.full=nope", ["runs_with_head", "first_step_mean"]].tolist() == [1, 39]
    assert np.isnan(by.loc["W=16 EEEF pos.full=nope", "first_step_ci_low"])  # a seed without a head: no mean to bound
    assert by.loc["W=64 EEEF pos.full=rope", "runs_with_head"] == 0
    hc = csv(out, "head_curves.csv")
    maxes = hc[(hc["metric"] == "heads/max_score") & (hc["label"] == "W=16 EEEF pos.full=rope")]
    assert maxes["mean"].tolist() == pytest.approx([0.0, 0.125, 0.2, 0.4])
    counts = hc[(hc["metric"] == "heads/retrieval_heads") & (hc["label"] == "W=16 EEEF pos.full=rope")]
    assert counts["mean"].tolist() == pytest.approx([0, 0.5, 1, 1.5]) and counts["max"].tolist() == [0, 1, 1, 2]


def test_first_head_is_held_for_good():
    """A head that appears once and goes again does not count: the first step is where heads stay."""
    from hybrid_lightning.analysis import tables

    counts = [(9, 0), (19, 1), (29, 0), (39, 2), (49, 1)]
    metrics = pd.DataFrame([{"run": "r", "label": "W=16", "seed": 0, "metric": "heads/retrieval_heads", "step": step,
                             "tokens": 16 * (step + 1), "value": float(v)} for step, v in counts])
    configs = pd.DataFrame([{"run": "r", "arch": json.dumps({"model.window": 16})}])
    first = tables.first_heads(metrics, configs).iloc[0]
    assert (first["first_step"], first["first_tokens"], first["scored_until"]) == (39, 640, 49)


def test_niah_pos_maps_and_summary_csvs(fabricated):
    _, out = fabricated
    niah = csv(out, "niah.csv")
    cells = niah[niah["run"] == "nope-s1"].set_index(["length", "depth"])["value"]
    assert (niah[niah["run"] == "nope-s1"]["step"] == 39).all()
    assert cells.to_dict() == pytest.approx({(8, 0.0): 0.5, (8, 1.0): 0.5, (16, 0.0): 0.6, (16, 1.0): 0.6})
    pos = csv(out, "nope_vs_rope.csv")
    (row,) = pos.to_dict("records")
    assert row["factor"] == "model.pos.full" and row["base"] == "W=16 EEEF pos.full=rope"
    assert ([row[k] for k in ("score_beyond_rope", "score_beyond_nope", "score_beyond_delta")]
            == pytest.approx([0.7, 0.5, -0.2]))
    assert [row[k] for k in ("val_loss_rope", "val_loss_nope", "val_loss_delta")] == pytest.approx([2.1, 2.4, 0.3])
    maps = csv(out, "head_maps.csv")
    rope = maps[maps["label"] == "W=16 EEEF pos.full=rope"].set_index(["layer", "head"])
    assert (rope.loc[(3, 0), "score"] == pytest.approx(0.4) and rope.loc[(3, 0), "mixer"] == "full"
            and rope.loc[(0, 1), "mixer"] == "swa")
    assert rope.loc[(3, 0), "runs"] == 2 and len(rope) == 8
    s = csv(out, "summary.csv").set_index("label")
    rope = s.loc["W=16 EEEF pos.full=rope"]
    assert rope[["budget_tokens", "seeds", "done", "step", "val_loss", "score", "score_min", "score_max",
                 "score_beyond", "retrieval_heads", "max_head_score"]].tolist() == pytest.approx(
        [640, 2, 2, 39, 2.1, 0.7, 0.6, 0.8, 0.7, 1.5, 0.4])
    w64 = s.loc["W=64 EEEF pos.full=rope"]
    assert w64[["seeds", "done", "step", "val_loss", "score"]].tolist() == pytest.approx([1, 0, 19, 3.1, 0.3])
    full = s.loc["F pos.full=rope"]
    assert full["val_loss"] == pytest.approx(1.9) and np.isnan(full["score"])


def test_figures_have_labelled_axes_units_and_legends(fabricated):
    from hybrid_lightning.analysis import figures

    _, out = fabricated
    curve = csv(out, "emergence_curves.csv")
    fig = figures.emergence(curve, "answer-token accuracy - chance (share of answer tokens)")
    (ax,) = fig.axes
    assert ax.get_xlabel() == "training tokens seen" and "(share of answer tokens)" in ax.get_ylabel()
    legend = ax.get_legend()
    assert len(legend.get_texts()) == 3 and "(2 seeds)" in legend.get_texts()[0].get_text()
    hc = csv(out, "head_curves.csv")
    fig = figures.laziness({t: hc[hc["metric"] == t] for t in ("heads/retrieval_heads", "heads/max_score")}, 0.1)
    for ax in fig.axes:
        assert ax.get_xlabel() == "training tokens seen" and "(" in ax.get_ylabel()
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()][-1].startswith("threshold 0.1")
    niah = csv(out, "niah.csv")
    fig = figures.niah_heatmap(niah[niah["run"] == "rope-s0"], "rope-s0", "score (share of answer tokens)")
    assert fig.axes[0].get_xlabel() == "probe length (tokens)" and "depth" in fig.axes[0].get_ylabel()
    assert "share of answer tokens" in fig.axes[-1].get_ylabel()  # the colour bar
    fig = figures.head_maps(csv(out, "head_maps.csv"))
    assert fig.axes[0].get_xlabel() == "head" and "full attention" in fig.axes[0].get_ylabel()
    assert "retrieval score" in fig.axes[-1].get_ylabel()


def ablation_row(selection, heads, length, acc, masked_acc, n=2, task="passkey", k=2, seed=None):
    return {"step": 39, "tokens": 640, "selection": selection, "k": k, "seed": seed, "masked": heads, "task": task,
            "length": length, "n": n, "accuracy": float(acc == 1.0), "masked_accuracy": 0.0, "token_accuracy": acc,
            "masked_token_accuracy": masked_acc, "answer_loss": 0.1, "masked_answer_loss": 2.0,
            "chance_token_accuracy": 0.1, "chance_loss": CHANCE_LOSS}


def test_ablation_tables_and_verdict_on_known_values(tmp_path):
    """Ablation rows written into a run's last heads file: the per-draw table pools tasks weighted by
    probes, the summary pools random draws, and the verdict follows its rule (values by hand below)."""
    from hybrid_lightning.analysis import tables
    from hybrid_lightning.analysis.findings import findings

    root = tmp_path / "grid"
    for seed in (0, 1):
        fabricate(root / f"s{seed}", run_config(seed), "done", {"train/tokens": tokens_scalars(39)},
                  score=(0.0, 0.2, 0.4, 0.8), heads=((0, 0.0),) * 4)
    rows = [  # run s0: top-2 drops 0.9 at length 8 (passkey n=2: 1.0 -> 0.1; niah n=6: 1.0 -> 0.1)
        ablation_row("top", [[3, 0], [3, 1]], 8, 1.0, 0.1),
        ablation_row("top", [[3, 0], [3, 1]], 8, 1.0, 0.1, n=6, task="niah"),
        # random draws: seed 0 drops (2 x 0.4 + 6 x 0.0) / 8 = 0.1; seed 1 drops 0.3
        ablation_row("random", [[0, 0], [1, 1]], 8, 1.0, 0.6, seed=0),
        ablation_row("random", [[0, 0], [1, 1]], 8, 1.0, 1.0, n=6, task="niah", seed=0),
        ablation_row("random", [[2, 1], [0, 1]], 8, 1.0, 0.7, seed=1),
        ablation_row("random", [[2, 1], [0, 1]], 8, 1.0, 0.7, n=6, task="niah", seed=1),
        # beyond the training length (16 > seq_len 8): left out of the verdict
        ablation_row("random", [[0, 0], [1, 1]], 16, 1.0, 0.0, seed=0),
        ablation_row("list", [[1, 0]], 8, 1.0, 0.5, k=None),
    ]
    path = root / "s0" / "eval" / "heads_step_39.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "ablation": rows}))
    runs = load_runs(find_runs(root), root=root)
    draws = tables.ablation(runs.ablations, runs.configs)
    assert len(draws) == 5 and set(draws["run"]) == {"s0"}
    top = draws[draws["selection"] == "top"].iloc[0]
    assert (top["heads"], top["n"], top["within"]) == ("3.0 3.1", 8, True)
    assert top["token_drop"] == pytest.approx(0.9) and top["exact_drop"] == pytest.approx(1.0)
    rnd = draws[(draws["selection"] == "random") & draws["within"]].set_index("seed")["token_drop"]
    assert rnd[0] == pytest.approx(0.1) and rnd[1] == pytest.approx(0.3)
    summary = tables.ablation_summary(draws).set_index(["selection", "length"])
    assert summary.loc[("random", 8), "draws"] == 2 and summary.loc[("random", 8), "heads"] == ""
    assert (summary.loc[("random", 8), ["token_drop", "token_drop_min", "token_drop_max"]].tolist()
            == pytest.approx([0.2, 0.1, 0.3]))
    assert summary.loc[("random", 16), "token_drop"] == pytest.approx(1.0)
    assert summary.loc[("list", 8), "heads"] == "1.0" and summary.loc[("list", 8), "token_drop"] == pytest.approx(0.5)
    # No head is marked a retrieval head (and no selection report is recorded): the top-2 holds none.
    verdict = findings(runs).set_index("test").loc["ablation"]
    assert (verdict["verdict"] == "no signal"
            and "no retrieval head in the top-K (1 of 1 checkpoints)" in verdict["evidence"])
    assert "by the scored report (no selection report recorded)" in verdict["evidence"]
    analyze(root, tmp_path / "out", workers=1)
    assert len(pd.read_csv(tmp_path / "out" / "ablation.csv")) == 5
    assert "## 6. Head ablations" in (tmp_path / "out" / "report.md").read_text()
    # Head 3.0 a retrieval head: the top-2 is then the whole full layer (2 heads per layer), and the random
    # draws from other layers are no controls: not testable.
    report = json.loads(path.read_text())
    for h in report["heads"]:
        h["retrieval"] = (h["layer"], h["head"]) == (3, 0)
    path.write_text(json.dumps(report))
    verdict = findings(load_runs(find_runs(root), root=root)).set_index("test").loc["ablation"]
    assert verdict["verdict"] == "not testable" and "the top-K fills layer 3 (2 of 2 heads)" in verdict["reason"]
