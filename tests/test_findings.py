"""The findings' verdict rules (analysis/findings.py, analysis/stats.py) on fabricated runs with known
effects, each at 2 and at 5 seeds per arm: a strong effect at 5 seeds is reproduced with p < 0.05, the
same at 2 seeds is inconclusive for too few seeds, no effect is inconclusive with a CI spanning 0, the
reversed effect is refuted; and the statistics on constructed cases with exact values."""

import json
import math

import numpy as np
import pytest

from hybrid_lightning.analysis import stats
from hybrid_lightning.analysis.findings import findings
from hybrid_lightning.analysis.load import find_runs, load_runs
from hybrid_lightning.cli import main

from test_analysis import EVAL_STEPS, TOKENS_PER_STEP, ablation_row, fabricate, run_config, tokens_scalars


def arm(root, name, seeds, window=16, pos_full="rope", token_acc=lambda s: (0.1, 0.2, 0.3, 0.4), beyond=lambda s: 0.0,
        loss=lambda s: 2.0, heads=lambda s: ((0, 0.0),) * 4):
    """``seeds`` runs of one architecture under root/name-s<k>; each argument a function of the seed."""
    for s in range(seeds):
        fabricate(root / f"{name}-s{s}", run_config(s, window=window, pos_full=pos_full), "done",
                  {"train/tokens": tokens_scalars(39), "val/loss": [(39, loss(s))]},
                  token_acc=token_acc(s), beyond_extra=beyond(s), heads=heads(s))


def verdicts(root):
    return findings(load_runs(find_runs(root), root=root)).set_index("test")


def assert_reproduced(row):
    assert row["verdict"] == "reproduced", row.to_dict()
    assert row["p_holm"] < 0.05 and row["p"] <= row["p_holm"] and row["seeds"].split("/") == ["5"] * len(row["seeds"].split("/"))


def assert_inconclusive(row, reason):
    assert row["verdict"] == "inconclusive" and reason in row["reason"], row.to_dict()


def test_permutation_p_exact_values():
    """[1, 2, 4] vs [3, 5, 6]: of the C(6, 3) = 20 relabellings, the first arm sums to 7 or less in 2
    ({1,2,3}, {1,2,4}), so the lower tail is 2/20 and the two-sided p 0.2; separated arms of 5 give
    2/252, of 3 give 2/20, the floors ``min_p`` states."""
    assert stats.permutation_p([np.array([1.0, 2, 4]), np.array([3.0, 5, 6])]) == pytest.approx(0.2)
    assert stats.permutation_p([np.arange(5.0), np.arange(5.0) + 10]) == pytest.approx(2 / 252) == stats.min_p(5, 5)
    assert stats.permutation_p([np.arange(3.0), np.arange(3.0) + 10]) == pytest.approx(0.1) == stats.min_p(3, 3)
    assert stats.min_p(2, 2) == pytest.approx(1 / 3)
    # Three arms of two in the window's order: 2 of the 90 relabellings are as monotone (either way).
    arms = [np.array([1.0, 2]), np.array([3.0, 4]), np.array([5.0, 6])]
    assert stats.permutation_p(arms, stats.rank_correlation) == pytest.approx(2 * 1 / 90)
    # Stratified: one run of 4 heads, 1 retrieval head, in the only full layer: 1 of C(4, 1) = 4 placements.
    assert stats.stratified_p([(np.array([1.0, 0, 0, 0]), np.array([True, False, False, False]))]) == pytest.approx(0.5)
    assert stats.stratified_p([(np.array([1.0, 0, 0, 0]), np.array([True, False, False, False]))] * 2) == pytest.approx(2 / 16)


def test_monte_carlo_p_is_seeded_and_close_to_exact(monkeypatch):
    a, b = np.array([0.1, 0.5, 0.2, 0.9, 0.4, 0.3]), np.array([0.6, 0.8, 1.0, 0.7, 1.1, 0.35])
    exact = stats.permutation_p([a, b])
    monkeypatch.setattr(stats, "EXACT_LIMIT", 10)
    mc = stats.permutation_p([a, b])
    assert mc == stats.permutation_p([a, b]) and mc == pytest.approx(exact, abs=0.01) and mc != exact


def test_holm_and_bootstrap():
    assert stats.holm([0.01, 0.04, 0.03, math.nan])[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(stats.holm([0.01, math.nan])[1]) and stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    low, high = stats.bootstrap_ci([np.arange(5.0), np.arange(5.0) + 10])
    assert -10 - 4 <= low < -10 < high <= -10 + 4 and (low, high) == stats.bootstrap_ci([np.arange(5.0), np.arange(5.0) + 10])


def fast(s):  # reaches 0.8 at the first evaluation
    return (0.6 + 0.01 * s, 0.8 + 0.01 * s, 0.8 + 0.01 * s, 0.8 + 0.01 * s)


def slow(s):  # reaches half its peak two evaluations later, the same at the end
    return (0.0 + 0.01 * s, 0.1 + 0.01 * s, 0.6 + 0.01 * s, 0.8 + 0.01 * s)


def noisy(s):  # crosses 0.4 at step 19 or step 29 depending on the seed
    d = (-0.15, 0.15, -0.15, 0.15, -0.15)[s]
    return (0.1, 0.3 + d, 0.6, 0.8 + d / 3)


@pytest.mark.parametrize("seeds", [2, 5])
def test_emergence_strong_effect(tmp_path, seeds):
    """Fast: level 0.4 (half the lowest seed peak 0.8) at 160 tokens; slow: at 480; the spread of the
    means shrinks from 0.35 at step 19 to 0 at the end. 5 seeds: p = 2/252 each, Holm over the finding's two
    tests 0.016."""
    arm(tmp_path, "fast", seeds, window=16, token_acc=fast)
    arm(tmp_path, "slow", seeds, window=64, token_acc=slow)
    v = verdicts(tmp_path)
    speed, conv = v.loc["speed (probes)"], v.loc["convergence (probes)"]
    assert speed["compared"] == "W=64 - W=16" and speed["effect"] == pytest.approx(2 * 10 * TOKENS_PER_STEP)
    assert conv["effect"] == pytest.approx(0.35)
    if seeds == 5:
        assert_reproduced(speed), assert_reproduced(conv)
        assert speed["p"] == pytest.approx(2 / 252) and speed["p_holm"] == pytest.approx(4 / 252)
        assert "level 0.400" in speed["evidence"]
    else:
        assert_inconclusive(speed, "too few seeds"), assert_inconclusive(conv, "too few seeds")
        assert speed["seeds"] == "2/2"
    assert v.loc["speed (val/retrieval_acc rise)", "verdict"] == "not tested"


@pytest.mark.parametrize("seeds", [2, 5])
def test_emergence_no_effect(tmp_path, seeds):
    arm(tmp_path, "a", seeds, window=16, token_acc=noisy)
    arm(tmp_path, "b", seeds, window=64, token_acc=lambda s: noisy(seeds - 1 - s))  # the same seeds, reordered
    v = verdicts(tmp_path)
    for test in ("speed (probes)", "convergence (probes)"):
        assert v.loc[test, "effect"] == pytest.approx(0, abs=1e-9)
        assert_inconclusive(v.loc[test], "CI spans 0" if seeds == 5 else "too few seeds")
        assert v.loc[test, "ci_low"] <= 0 <= v.loc[test, "ci_high"]


@pytest.mark.parametrize("seeds", [2, 5])
def test_emergence_diverging_refutes_convergence(tmp_path, seeds):
    arm(tmp_path, "a", seeds, window=16, token_acc=lambda s: (0.1, 0.3 + 0.01 * s, 0.6, 0.9 + 0.01 * s))
    arm(tmp_path, "b", seeds, window=64, token_acc=lambda s: (0.1, 0.3 + 0.01 * s, 0.3, 0.3 + 0.01 * s))
    conv = verdicts(tmp_path).loc["convergence (probes)"]
    assert conv["effect"] == pytest.approx(-0.3)
    if seeds == 5:
        assert conv["verdict"] == "refuted" and conv["p_holm"] < 0.05
    else:
        assert_inconclusive(conv, "too few seeds")


def test_emergence_never_reaching_is_not_a_win(tmp_path):
    """An architecture one seed of which never rises is left out of the speed test, not counted as slower."""
    arm(tmp_path, "fast", 5, window=16, token_acc=fast)
    arm(tmp_path, "flat", 5, window=64, token_acc=lambda s: slow(s) if s else (0.0, 0.0, 0.01, 0.02))
    speed = verdicts(tmp_path).loc["speed (probes)"]
    assert_inconclusive(speed, "fewer than two architectures reach 0.05")
    assert "left out (a seed stays below 0.05): W=64" in speed["evidence"]


def heads_file(run, retrieval):
    """Marks the heads ``retrieval`` (layer, head) of the run's last scoring as retrieval heads."""
    path = run / "eval" / f"heads_step_{EVAL_STEPS[-1]}.json"
    report = json.loads(path.read_text())
    for h in report["heads"]:
        h["retrieval"] = (h["layer"], h["head"]) in retrieval
    report["total"]["retrieval_heads"] = len(retrieval)
    path.write_text(json.dumps(report))


@pytest.mark.parametrize("seeds", [2, 5])
@pytest.mark.parametrize("effect", ["strong", "none", "reversed"])
def test_where(tmp_path, seeds, effect):
    """4 layers x 2 heads, layer 3 full (a share of 0.25). Strong: both retrieval heads in it (+0.75 per run);
    none: one run in two has one there, the others none (+0.25, -0.25); reversed: four retrieval heads, all in
    SWA layers (-0.25 per run; each run has this placement with probability C(6,4)/C(8,4) = 3/14 by chance)."""
    arm(tmp_path, "h", seeds, heads=lambda s: ((0, 0.0),) * 3 + ((1, 0.5),))
    for s in range(seeds):
        heads_file(tmp_path / f"h-s{s}", {"strong": {(3, 0), (3, 1)}, "reversed": {(0, 0), (0, 1), (1, 0), (2, 1)},
                                          "none": {(3, 0), (1, 1)} if s % 2 else {(0, 0), (1, 1)}}[effect])
    where = verdicts(tmp_path).loc["where"]
    assert where["seeds"] == str(seeds)
    expected = {"strong": 0.75, "reversed": -0.25, "none": (seeds // 2 * 0.25 - (seeds - seeds // 2) * 0.25) / seeds}[effect]
    assert where["effect"] == pytest.approx(expected)
    if seeds == 2:
        assert_inconclusive(where, "too few seeds")
    elif effect == "strong":
        assert_reproduced(where)
    elif effect == "reversed":
        assert where["verdict"] == "refuted" and where["p_holm"] < 0.05
    else:
        assert_inconclusive(where, "CI spans 0")


@pytest.mark.parametrize("seeds", [2, 5])
@pytest.mark.parametrize("effect", ["strong", "none", "reversed"])
def test_ablation(tmp_path, seeds, effect):
    """Per run a top-2 masking and four random-2 draws (drops 0.1, 0.3, 0.2, 0.2, mean 0.2); the top-2 drop is
    0.9 (strong), 0.2 (none) or 0.0 (reversed). p exact over the 5^seeds placements of the top-K among the draws."""
    top = {"strong": 0.9, "none": 0.2, "reversed": 0.0}[effect]
    arm(tmp_path, "a", seeds)
    for s in range(seeds):
        rows = [ablation_row("top", [[3, 0], [3, 1]], 8, 1.0, 1.0 - top)]
        rows += [ablation_row("random", [[0, d], [1, d]], 8, 1.0, 1.0 - drop, seed=d) for d, drop in enumerate((0.1, 0.3, 0.2, 0.2))]
        path = tmp_path / f"a-s{s}" / "eval" / f"heads_step_{EVAL_STEPS[-1]}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "ablation": rows}))
    row = verdicts(tmp_path).loc["ablation"]
    assert row["effect"] == pytest.approx(top - 0.2) and row["seeds"] == str(seeds)
    if seeds == 2:
        assert_inconclusive(row, "too few seeds")
    elif effect == "strong":
        assert_reproduced(row)
        assert row["p"] == pytest.approx(2 / 5 ** 5)
    elif effect == "reversed":
        assert row["verdict"] == "refuted" and row["p"] == pytest.approx(2 / 5 ** 5)
    else:
        assert_inconclusive(row, "CI spans 0")
    assert "as harmful:" in row["evidence"]


@pytest.mark.parametrize("seeds", [2, 5])
def test_ablation_uses_layer_matched_controls(tmp_path, seeds):
    """Where a checkpoint has the layer-matched controls of ``heads --mask-top K --controls N`` (selection
    ``control``, one ``draw`` index each, one seed), they are its null draws, each kept apart, and its
    --mask-random draws are not used: top drop 0.9, controls 0.1, 0.3, 0.2, 0.2 (mean 0.2), a random draw 0.9."""
    arm(tmp_path, "a", seeds)
    for s in range(seeds):
        rows = [ablation_row("top", [[3, 0], [3, 1]], 8, 1.0, 0.1)]
        rows += [ablation_row("control", [[3, d], [3, 3]], 8, 1.0, 1.0 - drop, seed=0) | {"draw": d}
                 for d, drop in enumerate((0.1, 0.3, 0.2, 0.2))]
        rows += [ablation_row("random", [[0, 0], [1, 0]], 8, 1.0, 0.1, seed=0)]
        path = tmp_path / f"a-s{s}" / "eval" / f"heads_step_{EVAL_STEPS[-1]}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "ablation": rows}))
    row = verdicts(tmp_path).loc["ablation"]
    assert row["effect"] == pytest.approx(0.7) and row["seeds"] == str(seeds)
    assert "layer-matched random draws" in row["evidence"] and "(draws: 4, as harmful: 0.20)" in row["evidence"]
    if seeds == 2:
        assert_inconclusive(row, "too few seeds")
    else:
        assert_reproduced(row)
        assert row["p"] == pytest.approx(2 / 5 ** 5)


def first_head(step):
    """Heads counts at EVAL_STEPS: a retrieval head from ``step`` on."""
    return tuple((int(s >= step), 0.5 * (s >= step)) for s in EVAL_STEPS)


@pytest.mark.parametrize("seeds", [2, 5])
@pytest.mark.parametrize("effect", ["strong", "none", "reversed"])
def test_laziness(tmp_path, seeds, effect):
    """Windows 16, 32, 64 (RoPE). Strong: heads from step 9, 19, 29 as the window grows (never for W=64's
    seed 0 in the strong case: ranks last); reversed: the other way; none: every window the same seeds' steps."""
    steps = {"strong": (9, 19, 29), "reversed": (29, 19, 9)}
    for i, w in enumerate((16, 32, 64)):
        if effect == "none":
            arm(tmp_path, f"w{w}", seeds, window=w, heads=lambda s, i=i: first_head(EVAL_STEPS[(s + i) % 3]))
        else:
            never = effect == "strong" and w == 64
            arm(tmp_path, f"w{w}", seeds, window=w, heads=lambda s, i=i, never=never: first_head(99 if never and s == 0 else steps[effect][i]))
    row = verdicts(tmp_path).loc["laziness"]
    assert row["seeds"] == f"{seeds}/{seeds}/{seeds}"
    if seeds == 2:
        assert_inconclusive(row, "too few seeds")
    elif effect == "strong":
        assert_reproduced(row)
        assert row["effect"] > 0.8 and "W=64: never" in row["evidence"]
        assert "W=16: 9, 9, 9, 9, 9 (mean 9, CI 9 to 9)" in row["evidence"]  # W=64 has a never: no mean, no CI
        assert row["evidence"].endswith("W=64: never, 29, 29, 29, 29")
    elif effect == "reversed":
        assert row["verdict"] == "refuted" and row["effect"] < -0.8
    else:
        assert abs(row["effect"]) < 0.2
        assert_inconclusive(row, "CI spans 0")


@pytest.mark.parametrize("seeds", [2, 5])
@pytest.mark.parametrize("effect", ["strong", "none", "reversed"])
def test_nope(tmp_path, seeds, effect):
    """Score beyond the training length NoPE - RoPE: +0.3, 0 or -0.3; val/loss NoPE - RoPE: 0 (strong: the
    cost is 0.02 below the allowed 0.02), 0.02 (none: at the limit) or 0.1 (reversed)."""
    shift, cost = {"strong": (0.3, 0.0), "none": (0.0, 0.02), "reversed": (-0.3, 0.1)}[effect]
    acc = lambda s: (0.1, 0.2, 0.3, 0.4 + 0.01 * s)
    arm(tmp_path, "rope", seeds, token_acc=acc, loss=lambda s: 2.0 + 0.001 * s)
    arm(tmp_path, "nope", seeds, pos_full="nope", token_acc=acc, beyond=lambda s: shift + 0.001 * s,
        loss=lambda s: 2.0 + cost + 0.001 * s)
    v = verdicts(tmp_path)
    beyond, loss = v.loc["beyond: pos.full=rope"], v.loc["cost: pos.full=rope"]
    assert beyond["effect"] == pytest.approx(shift + 0.001 * (seeds - 1) / 2) and loss["effect"] == pytest.approx(cost - 0.02, abs=1e-6)  # TensorBoard keeps float32
    assert beyond["seeds"] == loss["seeds"] == f"{seeds}/{seeds}"
    for row in (beyond, loss):
        if seeds == 2:
            assert_inconclusive(row, "too few seeds")
        elif effect == "strong":
            assert_reproduced(row)
            assert row["p_holm"] == pytest.approx(2 * 2 / 252)
        elif effect == "reversed":
            assert row["verdict"] == "refuted"
        else:
            assert_inconclusive(row, "CI spans 0")


def test_analyze_findings_states_effect_ci_p_and_seeds(tmp_path, capsys):
    """The command line prints the verdict table; report.md holds it with the details below; the CSVs
    hold every number."""
    arm(tmp_path / "runs", "fast", 5, window=16, token_acc=fast)
    arm(tmp_path / "runs", "slow", 5, window=64, token_acc=slow)
    assert main(["analyze", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--findings"]) == 0
    printed = capsys.readouterr().out
    assert "| 1. emergence speed | speed (probes) | reproduced | 320 tokens [320, 320] | 0.00794 (0.0159) | 5/5 |" in printed
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| effect [95% CI] | p (Holm) | seeds per arm |" in report and "### Details" in report
    assert "  - W=64 - W=16: 320 tokens [95% CI 320, 320], p 0.00794, Holm 0.0159, seeds 5/5: reproduced" in report
    import pandas as pd

    tests = pd.read_csv(tmp_path / "out" / "findings.csv")
    assert {"effect", "ci_low", "ci_high", "p", "p_holm", "seeds", "reason"} <= set(tests.columns)
    comparisons = pd.read_csv(tmp_path / "out" / "findings_comparisons.csv")
    assert len(comparisons) == 2 and set(comparisons["verdict"]) == {"reproduced"}


def test_three_seeds_say_when_no_p_can_be_small_enough(tmp_path):
    """3 seeds per arm, every NoPE seed far above every RoPE seed: the permutation p is 2/20 = 0.1 at best, so
    the verdict is inconclusive and says that more seeds, not a larger effect, are missing."""
    acc = lambda s: (0.1, 0.2, 0.3, 0.4 + 0.01 * s)
    arm(tmp_path, "rope", 3, token_acc=acc)
    arm(tmp_path, "nope", 3, pos_full="nope", token_acc=acc, beyond=lambda s: 0.3 + 0.001 * s)
    beyond = verdicts(tmp_path).loc["beyond: pos.full=rope"]
    assert beyond["p"] == pytest.approx(0.1) and beyond["ci_low"] > 0
    assert_inconclusive(beyond, "with 3/3 seeds no p can fall below 0.1")


def test_where_compares_only_heads_that_could_reach_a_source(tmp_path):
    """With reachability recorded, heads whose window never held a copy source (layers 0-1 here) are left out:
    among the 4 heads that could reach one, half are full-attention heads, and both retrieval heads are
    there, so the effect is 1 - 0.5 = +0.5 per run (it would be +0.75 counting every head)."""
    arm(tmp_path, "h", 5, heads=lambda s: ((0, 0.0),) * 3 + ((1, 0.5),))
    for s in range(5):
        path = tmp_path / f"h-s{s}" / "eval" / f"heads_step_{EVAL_STEPS[-1]}.json"
        report = json.loads(path.read_text())
        for h in report["heads"]:
            h["reach_steps"] = 0 if h["layer"] < 2 else 16
            h["reach_retrieval"] = h["layer"] == 3
            h["retrieval"] = h["layer"] == 3
        path.write_text(json.dumps(report))
    where = verdicts(tmp_path).loc["where"]
    assert where["effect"] == pytest.approx(0.5) and "could reach a copy source" in where["evidence"]
    assert_reproduced(where)
