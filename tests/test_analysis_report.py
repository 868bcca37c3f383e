"""analysis/ report: the report and its findings, provenance and missing runs on fabricated run directories,
``analyze`` on a real tiny grid (F2), and its time on 50 runs x 1000 logged steps (F3). The fabricated runs
and their helpers live in test_analysis.py."""

import json
import os
import shutil
import time

import pandas as pd
import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from conftest import REPO, run_cli
from hybrid_lightning.analysis.load import find_runs, load_runs
from hybrid_lightning.analysis.report import analyze
from hybrid_lightning.cli import main
from test_analysis import (
    TOKENS_PER_STEP,
    csv,
    fabricate,
    fabricated,  # noqa: F401 (a fixture: six fabricated runs, five done, one running)
    run_config,
    tokens_scalars,
)


def test_report_lists_what_is_missing_and_other_metrics(fabricated, tmp_path):  # noqa: F811
    root, out = fabricated
    report = (out / "report.md").read_text()
    assert "Runs not done: `w64-s0` (running, logged up to step 19 of 40)." in report
    assert "Runs without evaluation files (eval/*.json): `full-s0`." in report
    for name in ("emergence.png", "laziness.png", "head_maps.png", "niah/rope-s0.png"):
        assert f"]({name})" in report and (out / name).stat().st_size > 10_000
    analyze(root, tmp_path / "acc", metric="retrieval_acc", workers=2)
    t = csv(tmp_path / "acc", "emergence_thresholds.csv").set_index("label")
    assert list(t.index) == ["W=16 EEEF pos.full=rope"] and t["final"].item() == pytest.approx(0.4)
    assert t[["tokens_50", "tokens_90"]].values.tolist() == [[640, 640]]  # mean 0.15 then 0.4


def test_user_errors_name_the_argument(tmp_path, capsys):
    with pytest.raises(ValueError, match="--metric"):
        analyze(tmp_path, metric="bleu")
    assert main(["analyze", str(tmp_path)]) == 2
    assert "DIR: no run directory" in capsys.readouterr().err
    with pytest.raises(ValueError, match="DIR: .* is not a folder"):
        find_runs(tmp_path / "absent")


@pytest.mark.slow
def test_analyze_reads_50_runs_of_1000_steps(tmp_path):
    """50 runs x 1000 logged steps (train/loss, train/lr, train/tokens each step; validation every 50
    steps; 10 evaluations and head scorings) all analysed; the time it took is printed, not asserted
    (wall-clock limits belong to the benchmarks, not to functional tests)."""
    template = tmp_path / "template"
    writer = SummaryWriter(str(template))
    for step in range(1000):
        writer.add_scalar("train/loss", 5.0 - step / 1000, step)
        writer.add_scalar("train/lr", 1e-3, step)
        writer.add_scalar("train/tokens", (step + 1) * TOKENS_PER_STEP, step)
        if step % 50 == 49:
            writer.add_scalar("val/loss", 5.0 - step / 1000, step)
            writer.add_scalar("val/retrieval_acc", step / 1000, step)
    writer.close()
    events = next(template.glob("events.out.tfevents.*"))
    one = tmp_path / "one"
    fabricate(one, run_config(0), "done", {}, score=(0.1, 0.2, 0.3, 0.4), heads=((0, 0.1),) * 4)
    root = tmp_path / "big"
    for i in range(50):
        run = root / f"w{16 * (1 + i % 5)}-s{i // 5}"
        shutil.copytree(one, run)
        (run / "config.yaml").write_text(yaml.safe_dump(run_config(i // 5, window=16 * (1 + i % 5))))
        shutil.copy(events, run / events.name)
        for k in range(6):  # 10 evaluations and head scorings in all
            for prefix in ("step", "heads_step"):
                src = json.loads((run / "eval" / f"{prefix}_39.json").read_text())
                (run / "eval" / f"{prefix}_{100 * k + 139}.json").write_text(
                    json.dumps(src).replace('"step": 39', f'"step": {100 * k + 139}'))
    start = time.perf_counter()
    analyze(root, tmp_path / "out")
    seconds = time.perf_counter() - start
    metrics = pd.read_csv(tmp_path / "out" / "metrics.csv")
    assert metrics[metrics["metric"] == "train/loss"].groupby("run").size().tolist() == [1000] * 50
    print(f"analyze: 50 runs x 1000 steps in {seconds:.1f} s ({os.cpu_count()} CPUs)")


# A grid small enough to train in seconds per cell on 2 cores, with both evaluation callbacks.
TINY_GRID = {
    "base": {
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "window": 16},
        "data": {"max_tokens": 2_000_000},
        "train": {"max_steps": 16, "batch_size": 4, "seq_len": 256, "warmup_steps": 2, "log_every_n_steps": 4,
                  "val_every_n_steps": 8, "val_batches": 1, "checkpoint_every_n_steps": 100, "progress_bar": False},
        "eval": {"every_n_steps": 8, "tasks": ["passkey"], "lengths": [256, 512], "depths": [0.0, 1.0],
                 "position_sequences": 0,
                 "heads": {"every_n_steps": 8, "tasks": ["passkey"], "lengths": [512], "depths": [0.0, 1.0]}},
    },
    "axes": {"arch": {"full": {"model.pattern": "F"}, "swa": {"model.pattern": "EF"}},
             "model.pos.full": ["rope", "nope"], "seed": [0]},
    "exclude": [{"arch": "full", "model.pos.full": "nope"}],
}


@pytest.mark.slow
def test_analyze_a_real_tiny_grid(tmp_path):
    """F2: a grid trained on CPU, analysed against a plan with one more seed: every figure and table, the
    cells not started, and labelled figures."""
    root = tmp_path / "runs"
    trained = tmp_path / "tiny.yaml"
    trained.write_text(yaml.safe_dump({**TINY_GRID, "root": str(root)}, sort_keys=False))
    planned = tmp_path / "planned.yaml"
    planned.write_text(yaml.safe_dump({**TINY_GRID, "root": str(root), "axes": {**TINY_GRID["axes"], "seed": [0, 1]}}))
    r = run_cli("grid", "submit", str(trained), "--executor", "local", "--parallel", "2", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = tmp_path / "analysis"
    r = run_cli("analyze", str(root), "--out", str(out), "--grid", str(planned))
    assert r.returncode == 0, r.stderr[-3000:]
    report = (out / "report.md").read_text()
    assert ("Grid: 6 planned cells, 3 with a run directory; not started: `arch=full,pos.full=rope,seed=1`, "
            "`arch=swa,pos.full=rope,seed=1`, `arch=swa,pos.full=nope,seed=1`.") in report
    assert "Runs not done: none." in report and "Runs without evaluation files (eval/*.json): none." in report
    cells = ["arch=full,pos.full=rope,seed=0", "arch=swa,pos.full=rope,seed=0", "arch=swa,pos.full=nope,seed=0"]
    for png in ["emergence.png", "laziness.png", "head_maps.png"] + [f"niah/{c.replace(',', '_')}.png" for c in cells]:
        assert (out / png).stat().st_size > 10_000 and f"]({png})" in report, png
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(summary["label"]) == ["EF pos.full=nope", "EF pos.full=rope", "F pos.full=rope"]
    assert (summary["budget_tokens"] == 16 * 4 * 256).all() and summary["val_loss"].between(1, 8).all()
    assert summary["score"].notna().all() and summary["max_head_score"].notna().all()
    curves = pd.read_csv(out / "emergence_curves.csv")
    assert sorted(set(curves["step"])) == [8, 16] and set(curves["tokens"]) == {8 * 1024, 16 * 1024}
    pos = pd.read_csv(out / "nope_vs_rope.csv")
    assert pos["base"].tolist() == ["EF pos.full=rope"] and pos["score_beyond_delta"].notna().all()
    maps = pd.read_csv(out / "head_maps.csv")
    assert set(maps.loc[maps["label"] == "EF pos.full=rope", "mixer"]) == {"swa", "full"}


def test_the_demo_grid_has_every_comparison(tmp_path):
    from hybrid_lightning.grid import load_grid

    grid = load_grid(REPO / "ablations" / "demo.yaml", root=tmp_path)
    models = {(c.config.model.pattern, c.config.model.mixer, c.config.model.window,
               c.config.model.pos.full) for c in grid.cells}
    assert models == {("F", "swa", 64, "rope"), ("EEEF", "swa", 16, "rope"), ("EEEF", "swa", 16, "nope"),
                      ("EEEF", "swa", 64, "rope"), ("EEEF", "gated_deltanet", 64, "rope")}
    assert sorted({c.config.seed for c in grid.cells}) == [0, 1]
    assert all(max(c.config.eval.lengths) > c.config.train.seq_len for c in grid.cells)


def test_findings_follow_their_rules_on_known_values(fabricated):  # noqa: F811
    """The verdicts and the numbers behind them on the fabricated runs (values worked out by hand in
    the comments), and the report opening with them."""
    from hybrid_lightning.analysis.findings import findings

    root, _ = fabricated
    table = findings(load_runs(find_runs(root), root=root)).set_index("test")
    # Two seeds per arm at most (W=64 has one): no claim can pass, each with its numbers. Null
    # standard error 0.15 (4 answer tokens at chance 0.1 within seq_len 8): a run's level 0.45, first reached
    # by rope-s1 at step 29, rope-s0 and nope-s1 at 39; but W=64 stops at step 19 (320 tokens), where every
    # run is censored: the restricted means are all 320. The family of hybrids that differ only in their
    # efficient layers is W=16 and W=64 with RoPE full layers (NoPE and full attention are not in it); no arm
    # of it emerged in every run by tau, so "faster among the arms that emerge" has nothing to compare.
    speed = table.loc["speed (probes)"]
    assert speed["verdict"] == "not testable at this budget" and "no two to compare how fast" in speed["reason"]
    assert "level 0.450 to 0.450" in speed["evidence"]
    assert "W=64 EEEF pos.full=rope: emerged in 0/1 runs; restricted mean 320" in speed["evidence"]
    assert speed["effect"] == pytest.approx(0) and speed["unit"] == "tokens" and "tau = 320" in speed["evidence"]
    # The family's common evaluations are steps 9 and 19: too few for the declared mid, late and end steps.
    conv = table.loc["convergence (probes)"]
    assert conv["verdict"] == "not tested" and "fewer than three common evaluations" in conv["evidence"]
    # val/retrieval_acc, logged by the W=16 RoPE runs alone, has no null with known sampling error.
    assert table.loc["speed (val/retrieval_acc rise)", "verdict"] == "not tested"
    # the retrieval heads are marked in each run's full layer, layer 3 in every run: one placement
    assert table.loc["where", "verdict"] == "not testable" and "confounded with depth" in table.loc["where", "reason"]
    assert table.loc["ablation", "verdict"] == "not tested"
    # First retrieval head for good: W=16 seeds at 29 and 19, W=64 none by its last scoring at 19 (censored
    # there): up to step 19 the two windows do not differ.
    lazy = table.loc["laziness"]
    assert (lazy["verdict"] == "inconclusive"
            and "W=16: 29, 19 (Kaplan-Meier median 19); W=64: never (19)" in lazy["evidence"])
    assert lazy["seeds"] == "1/2" and "W=64 - W=16: not testable (too few seeds (1 in an arm" in lazy["reason"]
    # Beyond the training length NoPE seeds 0.4, 0.6 vs RoPE 0.8, 0.6 (raw, -0.2); beyond - within NoPE 0.1 (both
    # seeds) vs RoPE 0: +0.1, the claim; no val/text_loss: the cost is not tested.
    beyond, cost = table.loc["beyond: W=16 EEEF pos.full=rope"], table.loc["cost: W=16 EEEF pos.full=rope"]
    assert beyond["effect"] == pytest.approx(0.1) and beyond["seeds"] == "2/2" and beyond["verdict"] == "not testable"
    assert "beyond it NoPE 0.500 vs RoPE 0.700" in beyond["evidence"]
    assert cost["verdict"] == "not tested" and "val/text_loss" in cost["evidence"]
    report = analyze(root, root.parent / "out-findings", workers=1, findings=True).read_text()
    assert (report.index("## Findings") < report.index("## 1. Emergence")
            and "| 2. retrieval heads | laziness | inconclusive |" in report)
    # no counts in provenance
    assert "These runs: 6, unknown non-embedding parameters N, 640-640 training tokens." in report
    findings = pd.read_csv(root.parent / "out-findings" / "findings.csv").set_index("test")
    # no size and budget axis among these runs: the scaling verdict says so
    assert findings["verdict"].size == 10 and findings.loc["scaling (LongPPL laws)", "verdict"] == "not applicable"


def test_provenance_plan_names_mixers_and_gives_parameter_counts(tmp_path):
    """A run whose provenance holds the layer plan is labelled from it, a mixer this process does not know
    included (no model is built); its parameter counts reach the configs and the findings' scale."""
    root = tmp_path / "grid"
    kinds = [("hyena", "H", None)] * 3 + [("full", "F", "rope")]
    config = run_config(0)
    config["model"]["mixer"] = "hyena"
    config["provenance"] = {"layers": [{"layer": i, "kind": k, "letter": letter, "window": None, "pos": pos}
                                       for i, (k, letter, pos) in enumerate(kinds)],
                            "params": {"embedding": 100, "non_embedding": 2000, "total": 2100}}
    fabricate(root / "hyena", config, "done", {"train/tokens": tokens_scalars(39)}, score=(0.0, 0.1, 0.2, 0.3))
    fabricate(root / "swa", run_config(0), "done", {"train/tokens": tokens_scalars(39)}, score=(0.0, 0.2, 0.4, 0.6))
    c = load_runs(find_runs(root), root=root).configs.set_index("run")
    assert c.loc["hyena", "label"] == "hyena" and c.loc["swa", "label"] == "swa"  # only what differs
    assert (c.loc["hyena", "mixers"], c.loc["hyena", "windowed"]) == ("hyena", False)
    assert c.loc["hyena", ["embedding_params", "non_embedding_params", "total_params"]].tolist() == [100, 2000, 2100]
    assert c.loc["swa", ["non_embedding_params"]].isna().all() and c.loc["swa", "windowed"]
    report = analyze(root, tmp_path / "out", workers=1, findings=True).read_text()
    assert ("These runs: 2, 2k-2k non-embedding parameters N, 640-640 training tokens (0.32N-0.32N; "
            "N unknown for 1 of 2 runs)." in report)


def test_report_lists_cells_that_failed_before_a_run_directory(fabricated, tmp_path):  # noqa: F811
    from hybrid_lightning.analysis.report import _missing
    from hybrid_lightning.rundir import runs_under

    root, _ = fabricated
    runs = load_runs(runs_under(root), root=root, workers=1)
    planned = [("rope-s0", root / "rope-s0", None), ("a", tmp_path / "a", "exit code 2: error: data.store: refused"),
               ("b", tmp_path / "b", None)]
    assert ("Grid: 3 planned cells, 1 with a run directory; failed before it: `a` (exit code 2: error: data.store: "
            "refused); not started: `b`.") in _missing(runs, planned, "val_longctx/score")


def test_the_emergence_section_draws_longppl_where_runs_log_it(tmp_path):
    """Runs with a LongPPL evaluator: its curve over training beside the score's (log axis), and its table."""
    from hybrid_lightning.analysis import report
    from hybrid_lightning.analysis.load import Runs
    from hybrid_lightning.analysis.metrics import SCORE
    from hybrid_lightning.records import Tag

    rows = [{"run": f"s{seed}", "step": step, "tokens": step * 100, "metric": metric, "value": value,
             "label": "swa W=8"}
            for seed in (0, 1) for step in (100, 200, 300)
            for metric, value in ((SCORE, step / 400), (Tag.LONGPPL, 60 / step + seed))]
    empty = pd.DataFrame()
    runs = Runs(empty, pd.DataFrame(rows), empty, empty, empty, empty, empty)
    text = report._emergence(runs, tmp_path, "score", SCORE)
    assert "![longppl](longppl.png)" in text and (tmp_path / "longppl.png").is_file()
    curve = pd.read_csv(tmp_path / "longppl_curves.csv")
    assert curve["mean"].tolist() == pytest.approx([1.1, 0.8, 0.7]) and set(curve["seeds"]) == {2}
    without = Runs(empty, pd.DataFrame([r for r in rows if r["metric"] == SCORE]), empty, empty, empty, empty, empty)
    (tmp_path / "none").mkdir()
    assert "longppl" not in report._emergence(without, tmp_path / "none", "score", SCORE)
