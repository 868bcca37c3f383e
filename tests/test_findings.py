"""The findings' verdict rules (analysis/findings.py, analysis/emergence.py, analysis/stats.py) on fabricated
runs with known effects, at 3 and 5 seeds per arm (2 where the rule on too few seeds is tested): a strong
effect at 5 seeds is reproduced with p < 0.05, the same at 3 seeds is inconclusive because no permutation p of
3 + 3 seeds falls below 0.1, no effect is inconclusive, the reversed effect is refuted; times that never come
are censored; and the statistics on constructed cases with exact values."""

import json
import math

import numpy as np
import pytest
from scipy import stats as st

from hybrid_lightning.analysis import permutation, stats, survival
from hybrid_lightning.analysis.findings import findings
from hybrid_lightning.analysis.findings import verdicts as both
from hybrid_lightning.analysis.load import find_runs, load_runs
from test_analysis import EVAL_STEPS, fabricate, run_config, tokens_scalars


def arm(root, name, seeds, window=16, pos_full="rope", score=lambda s: (0.1, 0.2, 0.3, 0.4), beyond=lambda s: 0.0,
        loss=lambda s: 2.0, heads=lambda s: ((0, 0.0),) * 4, pattern="EEEF", mixer="swa", n_heads=2):
    """``seeds`` runs of one architecture under root/name-s<k>; each argument a function of the seed; ``loss``
    is logged as val/loss and val/text_loss. The probe score's null standard error is 0.15 (4 answer tokens at
    chance 0.1 within the training length): a run's level is 0.45, an arm mean's 0.45 / sqrt(seeds)."""
    for s in range(seeds):
        config = run_config(s, window=window, pos_full=pos_full, pattern=pattern, mixer=mixer, n_heads=n_heads)
        fabricate(root / f"{name}-s{s}", config, "done",
                  {"train/tokens": tokens_scalars(39), "val/loss": [(39, loss(s))], "val/text_loss": [(39, loss(s))]},
                  score=score(s), beyond_extra=beyond(s), heads=heads(s))


def verdicts(root):
    return findings(load_runs(find_runs(root), root=root)).set_index("test")


def assert_reproduced(row, seeds=5):
    assert row["verdict"] == "reproduced", row.to_dict()
    assert row["p_holm"] < 0.05 and row["p"] <= row["p_holm"]
    assert set(row["seeds"].split("/")) <= {str(seeds), str(2 * seeds)}


def assert_verdict(row, verdict, reason=""):
    assert row["verdict"] == verdict and reason in row["reason"], row.to_dict()


def test_permutation_p_exact_values():
    """[1, 2, 4] vs [3, 5, 6]: of the C(6, 3) = 20 relabellings, the first arm sums to 7 or less in 2
    ({1,2,3}, {1,2,4}), so the lower tail is 2/20 and the two-sided p 0.2; separated arms of 5 give
    2/252, of 3 give 2/20, the floors ``min_p`` states."""
    assert stats.permutation_p([np.array([1.0, 2, 4]), np.array([3.0, 5, 6])]) == pytest.approx(0.2)
    assert stats.permutation_p([np.arange(5.0), np.arange(5.0) + 10]) == pytest.approx(2 / 252) == stats.min_p(5, 5)
    assert stats.permutation_p([np.arange(3.0), np.arange(3.0) + 10]) == pytest.approx(0.1) == stats.min_p(3, 3)
    assert stats.min_p(2, 2) == pytest.approx(1 / 3)
    # Stratified: one run of 4 heads, 1 retrieval head, in the only full layer: 1 of C(4, 1) = 4 placements.
    assert stats.stratified_p([(np.array([1.0, 0, 0, 0]), np.array([True, False, False, False]))]) == pytest.approx(0.5)
    assert (stats.stratified_p([(np.array([1.0, 0, 0, 0]), np.array([True, False, False, False]))] * 2)
            == pytest.approx(2 / 16))


def test_logrank_exact_permutation_p_and_censoring():
    """Five runs with events at step 9 against five censored at 39: z > 0 (the first arm's events come
    earlier), p = 2/252 exact; the asymptotic p (scipy alone) would be 0.0027. Both arms censored: NaN."""
    early, never = (np.full(5, 9.0), np.ones(5, bool)), (np.full(5, 39.0), np.zeros(5, bool))
    z, p = survival.logrank(early, never)
    assert z == pytest.approx(st.logrank(survival.censored(*early), survival.censored(*never)).statistic) and z > 0
    assert p == pytest.approx(2 / 252)
    assert survival.logrank(never, early)[0] == pytest.approx(-z)
    assert all(math.isnan(v) for v in survival.logrank(never, never))
    assert survival.km_median(np.array([9.0, 19, 29, 39]), np.array([True, True, False, False])) == 19
    assert math.isnan(survival.km_median(np.array([9.0, 39, 39]), np.array([True, False, False])))


def test_logrank_z_of_every_arrangement_is_scipys():
    """The vectorised z of every relabelling equals scipy.stats.logrank's, ties and censoring included."""
    rng = np.random.default_rng(0)
    t, e = rng.integers(1, 6, 8).astype(float) * 10, rng.random(8) < 0.6
    e[0] = True
    first = np.array([[i in c for i in range(8)] for c in ((0, 1, 2, 3), (0, 2, 5, 7), (1, 3, 4, 6))])
    z = survival.logrank_z(t, e, first)
    for row, value in zip(first, z):
        a, b = survival.censored(t[row], e[row]), survival.censored(t[~row], e[~row])
        assert value == pytest.approx(st.logrank(a, b).statistic)


def test_monte_carlo_p_is_seeded_and_close_to_exact(monkeypatch):
    a, b = np.array([0.1, 0.5, 0.2, 0.9, 0.4, 0.3]), np.array([0.6, 0.8, 1.0, 0.7, 1.1, 0.35])
    exact = stats.permutation_p([a, b])
    monkeypatch.setattr(permutation, "EXACT_LIMIT", 10)
    monkeypatch.setattr(permutation, "PERMUTATIONS", 500)  # fewer than the 924 relabellings
    mc = stats.permutation_p([a, b])
    assert mc == stats.permutation_p([a, b]) and mc == pytest.approx(exact, abs=0.02) and mc != exact


def test_holm_and_intervals():
    assert stats.holm([0.01, 0.04, 0.03, math.nan])[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(stats.holm([0.01, math.nan])[1]) and stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    a, b = np.arange(5.0), np.arange(5.0) + 10
    welch = st.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert stats.interval(a, b) == pytest.approx((welch.low, welch.high)) and welch.low < -10 < welch.high
    assert stats.interval(np.full(3, 2.0), np.full(3, 1.0)) == (1.0, 1.0)  # no spread over seeds: the point
    assert (stats.mean_ci(np.array([1.0, 2, 3]))
            == pytest.approx(tuple(st.ttest_1samp([1, 2, 3], 0).confidence_interval())))


def first_head(step):
    """Heads counts at EVAL_STEPS: a retrieval head from ``step`` on (never for a step after 39)."""
    return tuple((int(s >= step), 0.5 * (s >= step)) for s in EVAL_STEPS)


def windows(root, seeds, steps):
    """Windows 16, 32, 64 (RoPE), their runs' first-head steps ``steps[i](s)`` (99: never)."""
    for i, w in enumerate((16, 32, 64)):
        arm(root, f"w{w}", seeds, window=w, heads=lambda s, i=i: first_head(steps[i](s)))


@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("effect", ["strong", "none", "reversed"])
def test_laziness(tmp_path, seeds, effect):
    """Strong: heads from step 9, 19, 29 as the window grows (W=64's seed 0 never: censored at 39); reversed:
    the other way; none: every window the same seeds' steps. Each adjacent pair: exact log-rank p 2/252 at 5
    seeds (Holm over the two pairs 4/252); at 3 seeds no p below 0.1."""
    steps = {"strong": (lambda s: 9, lambda s: 19, lambda s: 99 if s == 0 else 29),
             "reversed": (lambda s: 29, lambda s: 19, lambda s: 9),
             "none": tuple(lambda s, i=i: EVAL_STEPS[(s + i) % 3] for i in range(3))}[effect]
    windows(tmp_path, seeds, steps)
    row = verdicts(tmp_path).loc["laziness"]
    assert row["seeds"] == f"{seeds}/{seeds}"
    if effect == "strong":
        assert "W=64: never (39), 29" in row["evidence"] and "W=16: 9, 9, 9" in row["evidence"]
        assert row["effect"] >= 10  # steps: W=64 - W=32 or W=32 - W=16, whichever is more significant
        if seeds == 5:
            assert_reproduced(row)
            assert row["p"] == pytest.approx(2 / 252)
        else:
            assert_verdict(row, "inconclusive", "every pair in the predicted direction, none significant")
    elif effect == "reversed":
        assert row["effect"] == pytest.approx(-10)
        assert_verdict(row, "refuted" if seeds == 5 else "inconclusive")
    else:
        assert row["verdict"] == "inconclusive"


def test_laziness_compares_windows_of_one_pattern_only(tmp_path):
    """A depth control (FEEE at W=16, heads never) is another family: pooled with the EEEF W=16 runs it would
    make the smallest window look late; alone, with one window, it is not tested."""
    windows(tmp_path, 5, (lambda s: 9, lambda s: 19, lambda s: 99 if s == 0 else 29))
    arm(tmp_path, "feee16", 5, window=16, pattern="FEEE", heads=lambda s: first_head(99))
    tests = verdicts(tmp_path)
    assert [t for t in tests.index if t.startswith("laziness")] == ["laziness"]
    row = tests.loc["laziness"]
    assert_reproduced(row)
    assert row["p"] == pytest.approx(2 / 252) and "W=16: 9, 9, 9, 9, 9 " in row["evidence"]
    arm(tmp_path, "feee64", 5, window=64, pattern="FEEE", heads=lambda s: first_head(19))
    tests = verdicts(tmp_path)
    assert sorted(t for t in tests.index if t.startswith("laziness")) == [
        "laziness: W=16 EEEF", "laziness: W=16 FEEE"], tests.index.tolist()
    assert tests.loc["laziness: W=16 EEEF", "p"] == pytest.approx(2 / 252)
    assert tests.loc["laziness: W=16 FEEE", "effect"] < 0  # W=64 earlier than W=16 in that family


@pytest.mark.parametrize("seeds", [3, 5])
def test_laziness_smaller_window_later_is_not_reproduced(tmp_path, seeds):
    """The smallest window forms heads later (29) than the middle one (9) and the largest never does: the
    largest-never pair alone would read as laziness, but the pair W=16, W=32 goes the other way."""
    windows(tmp_path, seeds, (lambda s: 29, lambda s: 9, lambda s: 99))
    row = verdicts(tmp_path).loc["laziness"]
    assert row["verdict"] != "reproduced"
    assert_verdict(row, "refuted" if seeds == 5 else "inconclusive", "W=32 - W=16")


def mark_windowed(run, from_step):
    """Head 0.0 (a windowed layer of EEEF) a retrieval head at every scoring from ``from_step`` on."""
    for path in sorted((run / "eval").glob("heads_step_*.json")):
        report = json.loads(path.read_text())
        if report["step"] >= from_step:
            report["heads"][0]["retrieval"] = True
            report["total"]["retrieval_heads"] += 1
            path.write_text(json.dumps(report))


def test_laziness_times_full_layer_heads_only(tmp_path):
    """Full-layer heads form in the paper's order (W=16 at step 9, W=32 at 19, W=64 at 29, its seed 0 never),
    while W=32 and W=64 also form a retrieval head in a windowed layer at step 9: timed on any layer's heads
    every window would start at 9; timed on the full layers' heads laziness is reproduced, and the windowed
    heads are in the evidence beside it."""
    windows(tmp_path, 5, (lambda s: 9, lambda s: 19, lambda s: 99 if s == 0 else 29))
    for w in (32, 64):
        for s in range(5):
            mark_windowed(tmp_path / f"w{w}-s{s}", 9)
    row = verdicts(tmp_path).loc["laziness"]
    assert_reproduced(row)
    assert "W=32: 19, 19, 19, 19, 19" in row["evidence"] and "W=32: 9, 9, 9, 9, 9" in row["evidence"]
    assert "W=16: never, never" in row["evidence"]


@pytest.mark.parametrize("seeds", [3, 5])
def test_laziness_two_censored_windows_are_not_testable(tmp_path, seeds):
    """W=16 forms heads at step 9, W=32 and W=64 never: the pair W=32, W=64 has no event and cannot support
    "larger windows later" beyond the smallest window."""
    windows(tmp_path, seeds, (lambda s: 9, lambda s: 99, lambda s: 99))
    row = verdicts(tmp_path).loc["laziness"]
    assert_verdict(row, "inconclusive", "W=64 - W=32: not testable (both arms censored)")


@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("effect", ["strong", "none", "reversed"])
def test_nope(tmp_path, seeds, effect):
    """Score beyond the training length NoPE - RoPE: +0.3, 0 or -0.3; val/text_loss NoPE - RoPE: 0 (strong: the
    cost is 0.02 below the allowed 0.02), 0.02 (none: at the limit) or 0.1 (reversed)."""
    shift, cost = {"strong": (0.3, 0.0), "none": (0.0, 0.02), "reversed": (-0.3, 0.1)}[effect]
    def acc(s):
        return (0.1, 0.2, 0.3, 0.4 + 0.01 * s)
    arm(tmp_path, "rope", seeds, score=acc, loss=lambda s: 2.0 + 0.001 * s)
    arm(tmp_path, "nope", seeds, pos_full="nope", score=acc, beyond=lambda s: shift + 0.001 * s,
        loss=lambda s: 2.0 + cost + 0.001 * s)
    v = verdicts(tmp_path)
    beyond, loss = v.loc["beyond: pos.full=rope"], v.loc["cost: pos.full=rope"]
    # TensorBoard keeps float32
    assert (beyond["effect"] == pytest.approx(shift + 0.001 * (seeds - 1) / 2)
            and loss["effect"] == pytest.approx(cost - 0.02, abs=1e-6))
    assert beyond["seeds"] == loss["seeds"] == f"{seeds}/{seeds}" and "val/text_loss" in loss["compared"]
    for row in (beyond, loss):
        if seeds == 3 and effect != "none":
            assert_verdict(row, "inconclusive", "no p can fall below 0.1")
        elif effect == "strong":
            assert_reproduced(row)
            assert row["p_holm"] == pytest.approx(2 * 2 / 252)
        elif effect == "reversed":
            assert row["verdict"] == "refuted"
        else:
            assert_verdict(row, "inconclusive")



def test_a_grid_that_declares_its_tests_is_judged_on_those_alone(tmp_path):
    """The strong NoPE pair at 5 seeds, the grid declaring ``tests: [beyond]``: one row, its claim alone in finding
    3's Holm family (p 2/252 unadjusted, against twice that beside the cost claim)."""
    from hybrid_lightning.grid.schema import VerdictsSpec

    arm(tmp_path, "rope", 5, score=lambda s: (0.1, 0.2, 0.3, 0.4 + 0.01 * s), loss=lambda s: 2.0 + 0.001 * s)
    arm(tmp_path, "nope", 5, pos_full="nope", score=lambda s: (0.1, 0.2, 0.3, 0.4 + 0.01 * s),
        beyond=lambda s: 0.3 + 0.001 * s, loss=lambda s: 2.0 + 0.001 * s)
    runs = load_runs(find_runs(tmp_path), root=tmp_path)
    rows = findings(runs, VerdictsSpec.model_validate({"tests": ["beyond"]}).declared())
    assert rows["test"].tolist() == ["beyond: pos.full=rope"] and rows["verdict"].tolist() == ["reproduced"]
    assert rows["p_holm"].tolist() == pytest.approx([2 / 252])

def test_nope_cost_needs_natural_text(tmp_path):
    """Runs that log val/loss (on data.files, possibly probe documents) but no val/text_loss: not tested."""
    for name, pos in (("rope", "rope"), ("nope", "nope")):
        for s in range(3):
            fabricate(tmp_path / f"{name}-s{s}", run_config(s, pos_full=pos), "done",
                      {"train/tokens": tokens_scalars(39), "val/loss": [(39, 2.0)]}, score=(0.1, 0.2, 0.3, 0.4))
    assert_verdict(verdicts(tmp_path).loc["cost: pos.full=rope"], "not tested")


def test_three_seeds_say_when_no_p_can_be_small_enough(tmp_path):
    """3 seeds per arm, every NoPE seed far above every RoPE seed: the permutation p is 2/20 = 0.1 at best, so
    the verdict is inconclusive and says that more seeds, not a larger effect, are missing."""
    def acc(s):
        return (0.1, 0.2, 0.3, 0.4 + 0.01 * s)
    arm(tmp_path, "rope", 3, score=acc)
    arm(tmp_path, "nope", 3, pos_full="nope", score=acc, beyond=lambda s: 0.3 + 0.001 * s)
    beyond = verdicts(tmp_path).loc["beyond: pos.full=rope"]
    assert beyond["p"] == pytest.approx(0.1) and beyond["ci_low"] > 0
    assert_verdict(beyond, "inconclusive", "with 3/3 seeds no p can fall below 0.1")


@pytest.mark.parametrize("seeds", [3, 5])
def test_nope_beyond_is_conditioned_on_within(tmp_path, seeds):
    """NoPE scores 0.3 higher within the training length and just as much higher beyond it: the raw beyond
    score shows +0.3 (a context comparison, outside the Holm family), beyond - within shows nothing."""
    def rope(s):
        return (0.1, 0.2, 0.3, 0.4 + 0.01 * s)

    def nope(s):
        return (0.1, 0.2, 0.3, 0.7 + 0.01 * s)
    arm(tmp_path, "rope", seeds, score=rope, beyond=lambda s: -0.1)
    arm(tmp_path, "nope", seeds, pos_full="nope", score=nope, beyond=lambda s: -0.1)
    _, comparisons = both(load_runs(find_runs(tmp_path), root=tmp_path))
    beyond = verdicts(tmp_path).loc["beyond: pos.full=rope"]
    assert (beyond["compared"] == "NoPE - RoPE of (score beyond - score within)"
            and beyond["effect"] == pytest.approx(0, abs=1e-9))
    assert_verdict(beyond, "inconclusive", "CI spans 0")
    raw = comparisons[comparisons["compared"] == "NoPE - RoPE score beyond (raw)"].iloc[0]
    assert raw["effect"] == pytest.approx(0.3) and raw["verdict"] == "context" and math.isnan(raw["p_holm"])
    assert raw["p"] == pytest.approx(stats.min_p(seeds, seeds))


def test_tost_and_context_comparisons():
    """Equivalence by two one-sided Welch tests: p < 0.05 exactly where the 90% interval lies inside the
    margin; a context comparison stays out of Holm's family."""
    a, b = np.array([0.50, 0.52, 0.51, 0.49, 0.50]), np.array([0.51, 0.50, 0.52, 0.50, 0.49])
    p, ci = stats.tost(a, b, 0.05)
    assert p < 0.05 and -0.05 < ci[0] < ci[1] < 0.05
    p, ci = stats.tost(a + 0.1, b, 0.05)
    assert p > 0.5 and ci[0] > 0.05
    assert stats.tost(np.full(3, 0.5), np.full(3, 0.52), 0.05) == (0.0, (pytest.approx(-0.02), pytest.approx(-0.02)))
    claims = [stats.Comparison("a", 1.0, (0.5, 1.5), 0.01, 1, (5, 5)),
              stats.Comparison("b", 1.0, (0.5, 1.5), 0.02, 1, (5, 5))]
    context = stats.Comparison("c", 1.0, (0.5, 1.5), 0.001, 1, (5, 5), claim=False)
    stats.adjust([*claims, context])
    assert [c.p_adj for c in claims] == pytest.approx([0.02, 0.02]) and math.isnan(context.p_adj)
    assert context.verdict()[0] == "context"


def test_a_significant_p_with_an_interval_over_zero_is_not_reproduced():
    """Complete separation gives the permutation floor whatever the spread; the Welch interval says how large
    the effect is: where it spans 0 the verdict waits for more seeds."""
    c = stats.Comparison.of("x", [np.array([0.3, 0.9, 0.28, 0.95, 0.27]), np.array([0.0, 0.1, 0.05, 0.2, 0.25])], +1)
    c.p_adj = c.p
    assert c.p == pytest.approx(2 / 252) and c.ci[0] < 0 < c.ci[1]
    verdict, reason = c.verdict()
    assert verdict == "inconclusive" and "the 95% interval spans 0" in reason
