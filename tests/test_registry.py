"""The verdicts' registry (analysis/registry.py) and their one permutation test (analysis/permutation.py): a
toy verdict defined here and registered at run time appears in ``findings.csv`` and in ``grid plan
--verdicts``; the permutation test gives scipy's p, exact and Monte Carlo; the planner's p on a simulated
experiment is the verdict's p on the same runs."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from hybrid_lightning.analysis import permutation, power, registry, stats, survival, tables
from hybrid_lightning.analysis.report import analyze
from hybrid_lightning.analysis.stats import Comparison
from hybrid_lightning.analysis.verdict import Planned, Verdict, at_least, two_arms
from hybrid_lightning.cli import main
from test_design import grid_file
from test_findings import arm

TOY_FINDING = "4. toy finding"


def _toy_decide(runs):
    """val/loss at the last evaluation, the first label's arm minus the second's: any difference."""
    loss = tables.final_values(runs.metrics, "val/loss").set_index("run")["value"]
    arms = [loss.reindex(g["run"]).to_numpy() for _, g in runs.configs.groupby("label", sort=True)][:2]
    return [stats.Test(TOY_FINDING, TOY.name, [Comparison.of("val/loss, first arm - second", arms, 0)], "toy evidence")]


def _toy_plan(d, models):
    labels = sorted(d.arms)[:2]
    effect, simulate = models(TOY, labels, None)
    return [Planned(TOY_FINDING, TOY.name, "val/loss of two arms", labels, d.seeds(labels),
                    lambda s: at_least(s, [two_arms(*s)]), simulate, effect)]


TOY = Verdict(TOY_FINDING, "toy loss", _toy_decide, _toy_plan, lambda labels, _: power.normal([0.0, 3.0]),
              lambda arms, alpha: power.passes_means(arms, alpha, 0))


@pytest.fixture
def toy(monkeypatch):
    """The registry with the toy verdict registered after the built-in ones (for this test only)."""
    monkeypatch.setattr(registry, "VERDICTS", list(registry.VERDICTS))
    registry.register(TOY)
    monkeypatch.setattr(power, "REPLICATIONS", 100)
    monkeypatch.setattr(power, "MAX_SEEDS", 8)


def test_a_verdict_registered_at_run_time_is_in_the_findings_and_the_design_check(tmp_path, capsys, toy):
    arm(tmp_path / "runs", "w16", 5, window=16, loss=lambda s: 2.0 + 0.01 * s)
    arm(tmp_path / "runs", "w64", 5, window=64, loss=lambda s: 3.0 + 0.01 * s)
    analyze(tmp_path / "runs", tmp_path / "out", findings=True)
    rows = pd.read_csv(tmp_path / "out" / "findings.csv").set_index("test")
    toy_row = rows.loc[TOY.name]
    assert toy_row["finding"] == TOY_FINDING and toy_row["verdict"] == "reproduced" and toy_row["seeds"] == "5/5"
    assert toy_row["p"] == pytest.approx(2 / 252) and toy_row["p_holm"] == toy_row["p"]  # a family of its own
    assert rows.index[-1] == TOY.name  # after the built-in verdicts, in the order registered

    archs = {"w16": {"model.window": 16}, "w64": {"model.window": 64}}
    assert main(["grid", "plan", str(grid_file(tmp_path, archs, 5)), "--verdicts", "--json"]) == 0
    planned = {r["test"]: r for r in json.loads(capsys.readouterr().out)["tests"]}
    assert planned[TOY.name]["finding"] == TOY_FINDING and planned[TOY.name]["floor"] == pytest.approx(2 / 252)
    assert planned[TOY.name]["power"] > 0.9 and planned[TOY.name]["effect"].startswith("normal seeds")
    with pytest.raises(ValueError, match="registered already"):
        registry.register(TOY)


def test_every_test_name_is_its_verdicts():
    """Each built-in verdict once, under a name of its own."""
    keys = [(v.finding, v.name) for v in registry.VERDICTS]
    assert len(keys) == len(set(keys)) >= 8


@pytest.mark.parametrize("sizes, upper", [((3, 4), False), ((4, 4, 3), True), ((9, 9), False), ((5, 5, 5), True)])
def test_the_permutation_test_gives_scipys_p(sizes, upper, monkeypatch):
    """Exact (at most 50,000 relabellings) and Monte Carlo (C(18, 9) = 48,620 made Monte Carlo by the limit
    below, 756,756 relabellings of 5 + 5 + 5): scipy's ``permutation_test`` p, to rounding."""
    rng = np.random.default_rng(3)
    arms = [rng.normal(0.3 * i, 1.0, n) for i, n in enumerate(sizes)]
    statistic = permutation.spread if upper else permutation.mean_difference
    limit = 40_000 if sizes == (9, 9) else permutation.EXACT_LIMIT
    exact = permutation.count(sizes) <= limit

    def theirs(*samples, axis):
        x = np.concatenate(samples, axis=axis)
        groups = np.repeat(np.arange(len(samples)), [s.shape[axis] for s in samples])
        return statistic(np.moveaxis(x, axis, -1), groups[None])[..., 0]

    monkeypatch.setattr(permutation, "EXACT_LIMIT", limit)
    p = permutation.permutation_p(arms, statistic, upper)
    resamples = np.inf if exact else permutation.PERMUTATIONS
    scipy_p = st.permutation_test(arms, theirs, vectorized=True, n_resamples=resamples,
                                  alternative="greater" if upper else "two-sided",
                                  rng=np.random.default_rng(permutation.SEED)).pvalue
    assert permutation.relabellings(sizes)[1] == exact and p == pytest.approx(scipy_p, rel=1e-12)


def test_the_planner_and_the_verdicts_give_one_p():
    """Simulated experiments as the design check draws them: the planner's p of each (all at once) is the p
    the verdict computes from the same runs, and the planner passes exactly where the verdict reproduces the
    claim (two arms, 4 seeds: exact; six arms of 4: Monte Carlo; censored times: the log-rank test)."""
    rng = np.random.default_rng(1)
    two = power.normal([0.0, 1.2]).draw(rng, [4, 4])
    two = [a[:40] for a in two]
    planner = permutation.permutation_p(two)
    comparisons = [Comparison.of("b - a", [two[1][r], two[0][r]], +1) for r in range(40)]
    assert planner == pytest.approx([c.p for c in comparisons], rel=1e-12) and planner.min() < 0.05
    for c in comparisons:  # each experiment alone: Holm over one claim leaves its p
        c.p_adj = c.p
    assert (power.passes_means(two, 0.05, +1) == [c.verdict()[0] == "reproduced" for c in comparisons]).all()

    six = [a[:40] for a in power.normal([0.0, 0.0, 0.0, 0.0, 0.0, 1.5]).draw(rng, [4] * 6)]
    planner = permutation.permutation_p(six, permutation.spread, upper=True)
    verdicts = np.array([Comparison.among("arms", {str(i): a[r] for i, a in enumerate(six)}).p for r in range(40)])
    assert planner == pytest.approx(verdicts, rel=1e-12)
    for alpha in (0.001, 0.005, 0.02, 0.05, 0.2):  # the planner's rule passes where the verdict's p is below alpha
        assert (power.passes_means(six, alpha, 0) == (verdicts < alpha)).all()
    assert 0 < (verdicts < 0.05).sum() < 40

    a, b = power.censored([0.0, 2.0], np.linspace(0.1, 1.0, 10)).draw(rng, [4, 5])
    z, p = permutation.permutation_test([np.stack(a, axis=1)[:8], np.stack(b, axis=1)[:8]], survival.logrank_statistic)
    alone = [survival.logrank((a[0][r], a[1][r]), (b[0][r], b[1][r])) for r in range(8)]
    assert z == pytest.approx([x for x, _ in alone], rel=1e-9) and p == pytest.approx([y for _, y in alone], rel=1e-12)


def test_exploratory_arms_are_reported_and_left_out_of_the_verdicts(tmp_path, toy):
    """The toy verdict compares the first two arms by label: W=16 against W=256 when every arm counts (equal
    losses: not reproduced), W=16 against W=64 with W=256 declared exploratory (apart: reproduced)."""
    arm(tmp_path / "runs", "w16", 5, window=16, loss=lambda s: 2.0 + 0.01 * s)
    arm(tmp_path / "runs", "w256", 5, window=256, loss=lambda s: 2.0 + 0.01 * s)
    arm(tmp_path / "runs", "w64", 5, window=64, loss=lambda s: 3.0 + 0.01 * s)
    analyze(tmp_path / "runs", tmp_path / "all", findings=True)
    assert pd.read_csv(tmp_path / "all" / "findings.csv").set_index("test").loc[TOY.name, "verdict"] != "reproduced"
    aside = {tmp_path / "runs" / f"w256-s{s}" for s in range(5)}
    analyze(tmp_path / "runs", tmp_path / "out", findings=True, exploratory=aside)
    assert pd.read_csv(tmp_path / "out" / "findings.csv").set_index("test").loc[TOY.name, "verdict"] == "reproduced"
    text = (tmp_path / "out" / "findings.md").read_text()
    assert "Exploratory arms, declared in the grid" in text and "W=256" in text.split("Exploratory arms")[1]
    assert "(5 runs)" in text and "w256-s0" in pd.read_csv(tmp_path / "out" / "runs.csv")["run"].tolist()
