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

from hybrid_lightning.analysis import stats
from hybrid_lightning.analysis.findings import findings
from hybrid_lightning.analysis.load import find_runs, load_runs
from hybrid_lightning.cli import main

from test_analysis import EVAL_STEPS, TOKENS_PER_STEP, ablation_row, fabricate, run_config, tokens_scalars


def arm(root, name, seeds, window=16, pos_full="rope", token_acc=lambda s: (0.1, 0.2, 0.3, 0.4), beyond=lambda s: 0.0,
        loss=lambda s: 2.0, heads=lambda s: ((0, 0.0),) * 4, pattern="EEEF"):
    """``seeds`` runs of one architecture under root/name-s<k>; each argument a function of the seed; ``loss``
    is logged as val/loss and val/text_loss. The probe score's null standard error is 0.15 (4 answer tokens at
    chance 0.1 within the training length): a run's level is 0.45, an arm mean's 0.45 / sqrt(seeds)."""
    for s in range(seeds):
        fabricate(root / f"{name}-s{s}", run_config(s, window=window, pos_full=pos_full, pattern=pattern), "done",
                  {"train/tokens": tokens_scalars(39), "val/loss": [(39, loss(s))], "val/text_loss": [(39, loss(s))]},
                  token_acc=token_acc(s), beyond_extra=beyond(s), heads=heads(s))


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
    assert stats.stratified_p([(np.array([1.0, 0, 0, 0]), np.array([True, False, False, False]))] * 2) == pytest.approx(2 / 16)


def test_logrank_exact_permutation_p_and_censoring():
    """Five runs with events at step 9 against five censored at 39: z > 0 (the first arm's events come
    earlier), p = 2/252 exact; the asymptotic p (scipy alone) would be 0.0027. Both arms censored: NaN."""
    early, never = (np.full(5, 9.0), np.ones(5, bool)), (np.full(5, 39.0), np.zeros(5, bool))
    z, p = stats.logrank(early, never)
    assert z == pytest.approx(st.logrank(stats.censored(*early), stats.censored(*never)).statistic) and z > 0
    assert p == pytest.approx(2 / 252)
    assert stats.logrank(never, early)[0] == pytest.approx(-z)
    assert all(math.isnan(v) for v in stats.logrank(never, never))
    assert stats.km_median(np.array([9.0, 19, 29, 39]), np.array([True, True, False, False])) == 19
    assert math.isnan(stats.km_median(np.array([9.0, 39, 39]), np.array([True, False, False])))


def test_monte_carlo_p_is_seeded_and_close_to_exact(monkeypatch):
    a, b = np.array([0.1, 0.5, 0.2, 0.9, 0.4, 0.3]), np.array([0.6, 0.8, 1.0, 0.7, 1.1, 0.35])
    exact = stats.permutation_p([a, b])
    monkeypatch.setattr(stats, "EXACT_LIMIT", 10)
    monkeypatch.setattr(stats, "PERMUTATIONS", 500)  # fewer than the 924 relabellings, or scipy enumerates them
    mc = stats.permutation_p([a, b])
    assert mc == stats.permutation_p([a, b]) and mc == pytest.approx(exact, abs=0.02) and mc != exact


def test_holm_and_intervals():
    assert stats.holm([0.01, 0.04, 0.03, math.nan])[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(stats.holm([0.01, math.nan])[1]) and stats.holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    a, b = np.arange(5.0), np.arange(5.0) + 10
    welch = st.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert stats.interval(a, b) == pytest.approx((welch.low, welch.high)) and welch.low < -10 < welch.high
    assert stats.interval(np.full(3, 2.0), np.full(3, 1.0)) == (1.0, 1.0)  # no spread over seeds: the point
    assert stats.mean_ci(np.array([1.0, 2, 3])) == pytest.approx(tuple(st.ttest_1samp([1, 2, 3], 0).confidence_interval()))


def fast(s):  # above the run level 0.45 from the first evaluation
    return (0.6 + 0.01 * s, 0.8 + 0.01 * s, 0.8 + 0.01 * s, 0.8 + 0.01 * s)


def slow(s):  # above it two evaluations later, meeting the fast arm at the end
    return (0.0 + 0.01 * s, 0.1 + 0.01 * s, 0.6 + 0.01 * s, 0.8 + 0.01 * s)


def noisy(s):  # crosses 0.45 at step 19 or step 29 depending on the seed
    d = (-0.2, 0.2, -0.2, 0.2, -0.2)[s]
    return (0.1, 0.3 + d, 0.6, 0.8 + d / 3)


@pytest.mark.parametrize("seeds", [3, 5])
def test_emergence_different_speeds_meeting_at_the_end(tmp_path, seeds):
    """Fast: at its level at 160 tokens; slow: at 480; both above their levels from step 29, where the gap
    between the means is 0.2, then 0 at the end. 5 seeds: p = 2/252 each, Holm over the finding's
    comparisons; 3 seeds: no p below 0.1."""
    arm(tmp_path, "fast", seeds, window=16, token_acc=fast)
    arm(tmp_path, "slow", seeds, window=64, token_acc=slow)
    v = verdicts(tmp_path)
    speed, conv = v.loc["speed (probes)"], v.loc["convergence (probes)"]
    assert speed["compared"] == "W=64 - W=16 (restricted mean)" and speed["effect"] == pytest.approx(2 * 10 * TOKENS_PER_STEP)
    assert (speed["ci_low"], speed["ci_high"]) == pytest.approx((320, 320))  # every seed alike: the point
    assert conv["compared"] == "gap W=16 - W=64 at step 29 - at step 39" and conv["effect"] == pytest.approx(0.2)
    assert f"W=64: {seeds}/{seeds} reached" in speed["evidence"] and "from step 29" in conv["evidence"]
    if seeds == 5:
        assert_reproduced(speed), assert_reproduced(conv)
        assert speed["p"] == pytest.approx(2 / 252) and conv["p"] == pytest.approx(2 / 252)
    else:
        assert_verdict(speed, "inconclusive", "no p can fall below 0.1"), assert_verdict(conv, "inconclusive")
    assert v.loc["speed (val/retrieval_acc rise)", "verdict"] == "not tested"


@pytest.mark.parametrize("seeds", [3, 5])
def test_emergence_no_effect(tmp_path, seeds):
    arm(tmp_path, "a", seeds, window=16, token_acc=noisy)
    arm(tmp_path, "b", seeds, window=64, token_acc=lambda s: noisy(seeds - 1 - s))  # the same seeds, reordered
    v = verdicts(tmp_path)
    assert v.loc["speed (probes)", "effect"] == pytest.approx(0, abs=1e-9)
    assert_verdict(v.loc["speed (probes)"], "inconclusive")
    assert v.loc["speed (probes)", "ci_low"] <= 0 <= v.loc["speed (probes)", "ci_high"]
    assert v.loc["convergence (probes)", "verdict"] in ("inconclusive", "refuted") and v.loc["convergence (probes)", "verdict"] != "reproduced"


@pytest.mark.parametrize("seeds", [3, 5])
def test_emergence_still_diverging_is_neither_refuted_nor_reproduced(tmp_path, seeds):
    """Both arms above their levels from step 9; one keeps rising, the other stays: the gap grows to the
    end of the budget (0, 0.1, 0.2, 0.3), so convergence cannot be seen."""
    arm(tmp_path, "a", seeds, window=16, token_acc=lambda s: (0.5 + 0.01 * s, 0.6 + 0.01 * s, 0.7, 0.8 + 0.01 * s))
    arm(tmp_path, "b", seeds, window=64, token_acc=lambda s: (0.5 + 0.01 * s, 0.5 + 0.01 * s, 0.5, 0.5 + 0.01 * s))
    conv = verdicts(tmp_path).loc["convergence (probes)"]
    assert conv["effect"] == pytest.approx(-0.1) and conv["verdict"] not in ("refuted", "reproduced"), conv.to_dict()
    if seeds == 5:
        assert_verdict(conv, "not testable at this budget", "still diverging")


@pytest.mark.parametrize("seeds", [3, 5])
def test_emergence_staying_apart_refutes_convergence(tmp_path, seeds):
    """Both arms above their levels from step 9 and apart by the same 0.3 from then on: every architecture
    has risen and the gap does not fall; significantly apart at 5 seeds (refuted), not at 3."""
    arm(tmp_path, "a", seeds, window=16, token_acc=lambda s: (0.9 + 0.01 * s,) * 4)
    arm(tmp_path, "b", seeds, window=64, token_acc=lambda s: (0.6 + 0.01 * s,) * 4)
    conv = verdicts(tmp_path).loc["convergence (probes)"]
    assert conv["effect"] == pytest.approx(0, abs=1e-9)
    assert_verdict(conv, "refuted" if seeds == 5 else "inconclusive")


@pytest.mark.parametrize("seeds", [3, 5])
def test_emergence_never_reaching_is_censored_not_a_win(tmp_path, seeds):
    """An architecture that never rises is censored at the last evaluation (640 tokens), not dropped: the
    restricted means are 160 and 640 tokens; convergence cannot be seen."""
    arm(tmp_path, "fast", seeds, window=16, token_acc=fast)
    arm(tmp_path, "flat", seeds, window=64, token_acc=lambda s: (0.0, 0.0, 0.01, 0.02 + 0.01 * s))
    v = verdicts(tmp_path)
    speed, conv = v.loc["speed (probes)"], v.loc["convergence (probes)"]
    assert speed["compared"] == "W=64 - W=16 (restricted mean)" and speed["effect"] == pytest.approx(480)
    assert f"W=64: 0/{seeds} reached" in speed["evidence"] and "median not reached" in speed["evidence"]
    assert_verdict(speed, "reproduced" if seeds == 5 else "inconclusive")
    assert_verdict(conv, "not testable at this budget", "W=64 not above 3 standard errors by step 39")


def test_emergence_level_follows_the_sampling_error(tmp_path):
    """No run reaches 3 null standard errors (0.45 for a run): no signal, whatever a fixed 0.05 would say."""
    arm(tmp_path, "a", 5, window=16, token_acc=lambda s: (0.1, 0.2, 0.3, 0.4))
    arm(tmp_path, "b", 5, window=64, token_acc=lambda s: (0.0, 0.1, 0.2, 0.3))
    v = verdicts(tmp_path)
    assert v.loc["speed (probes)", "verdict"] == v.loc["convergence (probes)", "verdict"] == "no signal"
    assert "level up to 0.450" in v.loc["speed (probes)", "evidence"]


def heads_file(run, retrieval):
    """Marks the heads ``retrieval`` (layer, head) of the run's last scoring as retrieval heads."""
    path = run / "eval" / f"heads_step_{EVAL_STEPS[-1]}.json"
    report = json.loads(path.read_text())
    for h in report["heads"]:
        h["retrieval"] = (h["layer"], h["head"]) in retrieval
    report["total"]["retrieval_heads"] = len(retrieval)
    path.write_text(json.dumps(report))


@pytest.mark.parametrize("seeds", [3, 5])
def test_where_one_placement_cannot_tell_type_from_depth(tmp_path, seeds):
    """4 layers x 2 heads, layer 3 full in every run (a share of 0.25), both retrieval heads there (+0.75 per
    run, significant at the head level): the full layer is always the last, so the verdict cannot say
    "full attention" rather than "last layer"; the pooled count has its exact binomial interval."""
    arm(tmp_path, "h", seeds, heads=lambda s: ((0, 0.0),) * 3 + ((1, 0.5),))
    for s in range(seeds):
        heads_file(tmp_path / f"h-s{s}", {(3, 0), (3, 1)})
    where = verdicts(tmp_path).loc["where"]
    assert where["effect"] == pytest.approx(0.75) and where["seeds"] == str(seeds)
    assert_verdict(where, "inconclusive", "attention type confounded with depth")
    ci = st.binomtest(2 * seeds, 2 * seeds).proportion_ci(0.95, method="exact")
    assert f"{2 * seeds}/{2 * seeds} = 1.00 (exact 95% CI {ci.low:.2f} to 1.00)" in where["evidence"]
    assert f"layers [3] in {seeds} runs" in where["evidence"]


@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("effect", ["strong", "depth", "reversed"])
def test_where_two_placements(tmp_path, seeds, effect):
    """EEEF and FEEE runs, ``seeds`` each. Strong: the retrieval heads in each run's full layer (the full
    layers' share 1, the same layer where SWA 0: +1 per run). Depth: in layer 3 in every run, full or not (0
    per run: depth, not attention type). Reversed: each run's retrieval heads in the layer that is full in the
    other placement (-1 per run)."""
    layer = {"strong": {"EEEF": 3, "FEEE": 0}, "depth": {"EEEF": 3, "FEEE": 3}, "reversed": {"EEEF": 0, "FEEE": 3}}[effect]
    for pattern in ("EEEF", "FEEE"):
        arm(tmp_path, pattern, seeds, pattern=pattern, heads=lambda s: ((0, 0.0),) * 3 + ((1, 0.5),))
        for s in range(seeds):
            heads_file(tmp_path / f"{pattern}-s{s}", {(layer[pattern], 0), (layer[pattern], 1)})
    where = verdicts(tmp_path).loc["where"]
    assert where["seeds"] == str(2 * seeds)
    if effect == "strong":
        assert where["effect"] == pytest.approx(1.0) and "layer-level" in where["compared"]
        assert_reproduced(where, seeds)
    elif effect == "depth":
        assert where["effect"] == pytest.approx(0.0) and "layer-level" in where["compared"]
        assert_verdict(where, "inconclusive")
    else:
        assert where["verdict"] == "refuted" and where["p_holm"] < 0.05


@pytest.mark.parametrize("seeds", [3, 5])
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
    if effect == "strong":
        assert_reproduced(row, seeds)
        assert row["p"] == pytest.approx(2 / 5 ** seeds)
    elif effect == "reversed":
        assert row["verdict"] == "refuted" and row["p"] == pytest.approx(2 / 5 ** seeds)
    else:
        assert_verdict(row, "inconclusive", "CI spans 0")
    assert "as harmful:" in row["evidence"]


@pytest.mark.parametrize("seeds", [3, 5])
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
    assert_reproduced(row, seeds)
    assert row["p"] == pytest.approx(2 / 5 ** seeds)


@pytest.mark.parametrize("seeds", [3, 5])
def test_ablation_reports_layer_matched_and_nonretrieval_controls(tmp_path, seeds):
    """Both kinds of control draws of ``heads --mask-top K --controls N``: layer-matched (drops 0.1-0.3, mean
    0.2) and of non-retrieval heads (drops 0.0, 0.1, mean 0.05); top-K drop 0.9: two comparisons, +0.7 and
    +0.85 per run, each with its exact p 2/5^seeds (layer-matched) and 2/3^seeds (non-retrieval)."""
    from hybrid_lightning.analysis.findings import verdicts as both

    arm(tmp_path, "a", seeds)
    for s in range(seeds):
        rows = [ablation_row("top", [[3, 0], [3, 1]], 8, 1.0, 0.1)]
        rows += [ablation_row("control", [[3, d], [3, 3]], 8, 1.0, 1.0 - drop, seed=None) | {"draw": d}
                 for d, drop in enumerate((0.1, 0.3, 0.2, 0.2))]
        rows += [ablation_row("control_nonretrieval", [[0, d], [1, d]], 8, 1.0, 1.0 - drop, seed=None) | {"draw": d}
                 for d, drop in enumerate((0.0, 0.1))]
        path = tmp_path / f"a-s{s}" / "eval" / f"heads_step_{EVAL_STEPS[-1]}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "ablation": rows}))
    _, comparisons = both(load_runs(find_runs(tmp_path), root=tmp_path))
    c = comparisons[comparisons["test"] == "ablation"].set_index("compared")
    assert list(c.index) == ["top-K drop - layer-matched random-K drop (K = 2)", "top-K drop - non-retrieval random-K drop (K = 2)"]
    assert c["effect"].tolist() == pytest.approx([0.7, 0.85])
    assert c["p"].tolist() == pytest.approx([2 / 5 ** seeds, min(1.0, 2 / 3 ** seeds)])
    row = verdicts(tmp_path).loc["ablation"]
    assert "random draws of non-retrieval heads 0.050" in row["evidence"] and "layer-matched random draws 0.200" in row["evidence"]


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
    acc = lambda s: (0.1, 0.2, 0.3, 0.4 + 0.01 * s)
    arm(tmp_path, "rope", seeds, token_acc=acc, loss=lambda s: 2.0 + 0.001 * s)
    arm(tmp_path, "nope", seeds, pos_full="nope", token_acc=acc, beyond=lambda s: shift + 0.001 * s,
        loss=lambda s: 2.0 + cost + 0.001 * s)
    v = verdicts(tmp_path)
    beyond, loss = v.loc["beyond: pos.full=rope"], v.loc["cost: pos.full=rope"]
    assert beyond["effect"] == pytest.approx(shift + 0.001 * (seeds - 1) / 2) and loss["effect"] == pytest.approx(cost - 0.02, abs=1e-6)  # TensorBoard keeps float32
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
            assert_verdict(row, "inconclusive", "CI spans 0")


def test_nope_cost_needs_natural_text(tmp_path):
    """Runs that log val/loss (on data.files, possibly probe documents) but no val/text_loss: not tested."""
    for name, pos in (("rope", "rope"), ("nope", "nope")):
        for s in range(3):
            fabricate(tmp_path / f"{name}-s{s}", run_config(s, pos_full=pos), "done",
                      {"train/tokens": tokens_scalars(39), "val/loss": [(39, 2.0)]}, token_acc=(0.1, 0.2, 0.3, 0.4))
    assert_verdict(verdicts(tmp_path).loc["cost: pos.full=rope"], "not tested")


def test_analyze_findings_states_effect_ci_p_and_seeds(tmp_path, capsys):
    """The command line prints the verdict table; report.md holds it with the details below; the CSVs
    hold every number."""
    arm(tmp_path / "runs", "fast", 5, window=16, token_acc=fast)
    arm(tmp_path / "runs", "slow", 5, window=64, token_acc=slow)
    assert main(["analyze", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--findings"]) == 0
    printed = capsys.readouterr().out
    assert "| 1. emergence speed | speed (probes) | reproduced | 320 tokens [320, 320] | 0.00794 (0.0238) | 5/5 |" in printed
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| effect [95% CI] | p (Holm) | seeds per arm |" in report and "### Details" in report
    assert ("  - W=64 - W=16 (restricted mean): 320 tokens [95% CI 320, 320], p 0.00794, Holm 0.0238, seeds 5/5: "
            "reproduced") in report
    import pandas as pd

    tests = pd.read_csv(tmp_path / "out" / "findings.csv")
    assert {"effect", "ci_low", "ci_high", "p", "p_holm", "seeds", "reason"} <= set(tests.columns)
    comparisons = pd.read_csv(tmp_path / "out" / "findings_comparisons.csv")
    # speed; convergence: the fall of the gap and whether the two arms differ at the end (they do not)
    assert comparisons["verdict"].tolist() == ["reproduced", "reproduced", "inconclusive"]


def test_three_seeds_say_when_no_p_can_be_small_enough(tmp_path):
    """3 seeds per arm, every NoPE seed far above every RoPE seed: the permutation p is 2/20 = 0.1 at best, so
    the verdict is inconclusive and says that more seeds, not a larger effect, are missing."""
    acc = lambda s: (0.1, 0.2, 0.3, 0.4 + 0.01 * s)
    arm(tmp_path, "rope", 3, token_acc=acc)
    arm(tmp_path, "nope", 3, pos_full="nope", token_acc=acc, beyond=lambda s: 0.3 + 0.001 * s)
    beyond = verdicts(tmp_path).loc["beyond: pos.full=rope"]
    assert beyond["p"] == pytest.approx(0.1) and beyond["ci_low"] > 0
    assert_verdict(beyond, "inconclusive", "with 3/3 seeds no p can fall below 0.1")


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
    assert_verdict(where, "inconclusive", "attention type confounded with depth")
