"""Finding 1's verdicts (analysis/emergence.py) on fabricated runs with known effects, at 3 and 5 seeds per arm:
speed compares only hybrids that differ in their efficient layers, censored, each arm's emergence reported
apart from its speed; convergence is judged at evaluations declared before looking, reproduced only with
equivalence at the end, and not testable while the arms still move. Evaluations at steps 9, 19, 29, 39
(160-640 tokens); the declared steps are 19 (mid), 29 (late) and 39 (end)."""

import math

import pandas as pd
import pytest

from hybrid_lightning.analysis.convergence import CONVERGENCE, EQUIVALENCE_MARGIN, declared_steps
from hybrid_lightning.analysis.emergence import SPEED
from hybrid_lightning.analysis.findings import verdicts as both
from hybrid_lightning.analysis.load import find_runs, load_runs
from hybrid_lightning.cli import main
from test_analysis import TOKENS_PER_STEP
from test_findings import arm, assert_reproduced, assert_verdict, verdicts


def fast(s):  # above the run level 0.45 from the first evaluation
    return (0.6 + 0.01 * s, 0.8 + 0.01 * s, 0.8 + 0.01 * s, 0.8 + 0.01 * s)


def slow(s):  # above it two evaluations later, meeting the fast arm at step 29
    return (0.0 + 0.01 * s, 0.1 + 0.01 * s, 0.8 + 0.01 * s, 0.8 + 0.01 * s)


def never(s):
    return (0.0, 0.0, 0.01, 0.02 + 0.01 * s)


def test_declared_steps():
    assert declared_steps([9, 19, 29, 39]) == (19, 29, 39)
    assert declared_steps([199 + 200 * i for i in range(11)]) == (999, 1599, 2199)
    assert declared_steps([9, 39]) is None and declared_steps([29, 39]) is None


@pytest.mark.parametrize("seeds", [3, 5])
def test_identical_hybrids_with_only_the_reference_slower(tmp_path, seeds):
    """Two SWA hybrids alike (the same seeds' curves) and full attention and a depth control (FEEE) that
    never rise: the omnibus over all arms would call that a difference; the family of hybrids that differ
    only in their efficient layers is W=16 against W=64, which do not differ."""
    arm(tmp_path, "w16", seeds, window=16, score=fast)
    arm(tmp_path, "w64", seeds, window=64, score=fast)
    arm(tmp_path, "full", seeds, pattern="F", score=never)
    arm(tmp_path, "feee", seeds, pattern="FEEE", score=never)
    speed = verdicts(tmp_path).loc["speed (probes)"]
    assert (speed["compared"] == "W=64 EEEF - W=16 EEEF: restricted mean tokens among the arms every run of which "
            "emerged" and speed["effect"] == 0)
    assert_verdict(speed, "inconclusive", "CI spans 0")
    assert "family EEEF" in speed["evidence"] and "FEEE" not in speed["evidence"] and "F pos" not in speed["evidence"]
    assert f"W=64 EEEF: emerged in {seeds}/{seeds} runs" in speed["evidence"]


@pytest.mark.parametrize("seeds", [3, 5])
def test_speed_of_two_windows_with_censoring(tmp_path, seeds):
    """Fast: at its level at 160 tokens; slow: at 480 (a difference of 320 tokens, every seed alike); a third
    arm that never rises is censored at 640, never dropped: with three arms the effect is the standard
    deviation of the three restricted means (160, 480, 640), with no pair singled out."""
    arm(tmp_path, "fast", seeds, window=16, score=fast)
    arm(tmp_path, "slow", seeds, window=64, score=slow)
    speed = verdicts(tmp_path).loc["speed (probes)"]
    assert (speed["effect"] == pytest.approx(2 * 10 * TOKENS_PER_STEP)
            and (speed["ci_low"], speed["ci_high"]) == (320, 320))
    if seeds == 5:
        assert_reproduced(speed)
        assert speed["p"] == pytest.approx(2 / 252)
    else:
        assert_verdict(speed, "inconclusive", "no p can fall below 0.1")
    arm(tmp_path, "flat", seeds, window=128, score=never)
    v = verdicts(tmp_path)
    speed, share = v.loc["speed (probes)"], v.loc["emerges in more runs (probes)"]
    # faster among the arms that emerge: W=16 against W=64 alone, as before; W=128 is in the share claim
    assert speed["compared"] == "W=64 - W=16: restricted mean tokens among the arms every run of which emerged"
    assert speed["effect"] == pytest.approx(320)
    assert speed["verdict"] == ("reproduced" if seeds == 5 else "inconclusive")
    assert share["compared"] == "share of runs emerged by tau (SD of the 3 arm means)"
    assert share["effect"] == pytest.approx(pd.Series([1, 1, 0]).std(ddof=0)) and math.isnan(share["ci_low"])
    assert (f"W=128: emerged in 0/{seeds} runs" in speed["evidence"]
            and "Never emerged by tau: W=128" in speed["evidence"])
    _, comparisons = both(load_runs(find_runs(tmp_path), root=tmp_path))
    context = comparisons[comparisons["verdict"] == "context"].set_index("compared")["effect"]
    assert (context["restricted mean tokens to emergence, all arms (speed and share mixed) (SD of the 3 arm means)"]
            == pytest.approx(pd.Series([160, 480, 640]).std(ddof=0)))


def test_a_share_that_emerges_alone_is_not_faster(tmp_path):
    """Three arms whose runs emerge at one speed (step 9) where they emerge at all; W=128 emerges in 1 of 5
    run only. The restricted means of all arms would call W=128 slower; among the arms that emerge nothing
    differs (not faster), and the difference is the share claim's, its own test. (Before: speed reproduced.)"""
    arm(tmp_path, "a", 5, window=16, score=fast)
    arm(tmp_path, "b", 5, window=64, score=fast)
    arm(tmp_path, "c", 5, window=128, score=lambda s: fast(s) if s < 1 else never(s))
    v = verdicts(tmp_path)
    speed = v.loc["speed (probes)"]
    assert speed["verdict"] != "reproduced", speed.to_dict()
    assert speed["effect"] == 0 and "W=128" not in speed["compared"]
    share = v.loc["emerges in more runs (probes)"]
    assert share["compared"].startswith("share of runs emerged by tau") and share["effect"] > 0


@pytest.mark.parametrize("seeds", [3, 5])
def test_convergence_gap_closes_and_arms_end_equivalent(tmp_path, seeds):
    """W=16 0.9 from step 19, W=64 0.6 at step 19 and 0.9 from 29: a gap of 0.3 at the declared mid step,
    none at the end and no movement from 29 to 39. 5 seeds: reproduced (equivalence within the margin by two
    one-sided tests); 3 seeds: the gap at mid cannot be significant (p >= 0.1)."""
    arm(tmp_path, "a", seeds, window=16, score=lambda s: (0.6, 0.9 + 0.01 * s, 0.9 + 0.01 * s, 0.9 + 0.01 * s))
    arm(tmp_path, "b", seeds, window=64, score=lambda s: (0.5, 0.6 + 0.01 * s, 0.9 + 0.01 * s, 0.9 + 0.01 * s))
    conv = verdicts(tmp_path).loc["convergence (probes)"]
    if seeds == 5:
        assert_reproduced(conv)
        assert (conv["effect"] == pytest.approx(0, abs=1e-6)
                and -EQUIVALENCE_MARGIN < conv["ci_low"] <= conv["ci_high"] < EQUIVALENCE_MARGIN)
    else:
        assert_verdict(conv, "inconclusive", "no gap shown at the declared step")


@pytest.mark.parametrize("seeds", [3, 5])
def test_convergence_gap_halves_but_arms_stay_apart(tmp_path, seeds):
    """Gap 0.4 at step 19, 0.2 at 29 and 39: it halved, then stayed; the arms are apart at the end and no
    longer move: refuted at 5 seeds, inconclusive at 3 (no p below 0.1); never reproduced."""
    arm(tmp_path, "a", seeds, window=16, score=lambda s: (0.6, 0.9 + 0.01 * s, 0.8 + 0.01 * s, 0.8 + 0.01 * s))
    arm(tmp_path, "b", seeds, window=64, score=lambda s: (0.5, 0.5 + 0.01 * s, 0.6 + 0.01 * s, 0.6 + 0.01 * s))
    conv = verdicts(tmp_path).loc["convergence (probes)"]
    assert conv["verdict"] != "reproduced"
    if seeds == 5:
        assert_verdict(conv, "refuted", "stay apart at the end")
        assert conv["compared"] == "W=64 - W=16: arms at step 39" and conv["effect"] == pytest.approx(-0.2)
    else:
        assert_verdict(conv, "inconclusive")


@pytest.mark.parametrize("seeds", [3, 5])
def test_convergence_arms_still_drifting_apart(tmp_path, seeds):
    """Both above their levels from step 9; one keeps rising, the other stays: the gap grows to the end of
    the budget (0, 0.1, 0.2, 0.3). 5 seeds: still moving from step 29 to 39, not testable at this budget;
    3 seeds cannot show the movement (p >= 0.1): inconclusive; never refuted or reproduced."""
    arm(tmp_path, "a", seeds, window=16,
        score=lambda s: (0.5 + 0.01 * s, 0.6 + 0.01 * s, 0.7 + 0.01 * s, 0.8 + 0.01 * s))
    arm(tmp_path, "b", seeds, window=64,
        score=lambda s: (0.5 + 0.01 * s, 0.5 + 0.01 * s, 0.5 + 0.01 * s, 0.5 + 0.01 * s))
    conv = verdicts(tmp_path).loc["convergence (probes)"]
    assert conv["verdict"] not in ("refuted", "reproduced"), conv.to_dict()
    if seeds == 5:
        assert_verdict(conv, "not testable at this budget", "still move relative to each other")
        assert conv["compared"] == "W=64 - W=16: change from step 29 to 39" and conv["effect"] == pytest.approx(-0.1)


@pytest.mark.parametrize("seeds", [3, 5])
def test_an_arm_that_never_rises_leaves_convergence_not_testable(tmp_path, seeds):
    arm(tmp_path, "fast", seeds, window=16, score=fast)
    arm(tmp_path, "flat", seeds, window=64, score=never)
    conv = verdicts(tmp_path).loc["convergence (probes)"]
    assert_verdict(conv, "not testable at this budget", f"W=64 (0/{seeds} seeds) not above 3 null standard errors in "
                   "most seeds by the declared step 29")


@pytest.mark.parametrize("seeds", [3, 5])
def test_late_rising_lightning_leaves_convergence_not_testable(tmp_path, seeds):
    """Two SWA hybrids that converge (a gap at step 19, equal from 29) and a Lightning hybrid of which only
    seed 0 has risen by the budget, to the same plateau: the arms are apart at the end because Lightning has
    not risen, which says nothing against convergence: not testable at this budget, naming Lightning."""
    arm(tmp_path, "a", seeds, window=16, score=lambda s: (0.6, 0.9 + 0.01 * s, 0.9 + 0.01 * s, 0.9 + 0.01 * s))
    arm(tmp_path, "b", seeds, window=64, score=lambda s: (0.5, 0.6 + 0.01 * s, 0.9 + 0.01 * s, 0.9 + 0.01 * s))
    arm(tmp_path, "l", seeds, mixer="lightning",
        score=lambda s: (0.6, 0.9, 0.9, 0.9) if s == 0 else (0.0, 0.01 * s, 0.01 * s, 0.02 + 0.01 * s))
    conv = verdicts(tmp_path).loc["convergence (probes)"]
    assert_verdict(conv, "not testable at this budget", f"lightning (1/{seeds} seeds) not above 3 null")


def test_level_follows_the_sampling_error_and_retrieval_acc_is_not_tested(tmp_path):
    """No run reaches 3 null standard errors (0.45 for a run): no signal, whatever a fixed 0.05 would say.
    val/retrieval_acc, logged here on a plateau with small wiggles, has no null with known sampling error:
    not tested, rather than events read off the spread of three early validations."""
    from test_analysis import fabricate, run_config, tokens_scalars

    arm(tmp_path, "a", 5, window=16, score=lambda s: (0.1, 0.2, 0.3, 0.4))
    arm(tmp_path, "b", 5, window=64, score=lambda s: (0.0, 0.1, 0.2, 0.3))
    fabricate(tmp_path / "c-s0", run_config(0, window=32), "done", {"train/tokens": tokens_scalars(39),
                                                                     "val/retrieval_acc": [
        (9, 0.300), (19, 0.301), (29, 0.299), (39, 0.330)]}, score=(0.0, 0.0, 0.0, 0.0))
    v = verdicts(tmp_path)
    assert v.loc["speed (probes)", "verdict"] == v.loc["convergence (probes)", "verdict"] == "no signal"
    assert "level up to 0.450" in v.loc["speed (probes)", "evidence"]
    assert_verdict(v.loc["speed (val/retrieval_acc rise)"], "not tested", "no null with known sampling error")


def test_no_family_no_speed_test(tmp_path):
    """Full attention against one hybrid: no two hybrids differ only in their efficient layers: the speed test
    is not tested (and no convergence test is listed)."""
    arm(tmp_path, "w16", 3, window=16, score=fast)
    arm(tmp_path, "full", 3, pattern="F", score=slow)
    v = verdicts(tmp_path)
    assert_verdict(v.loc[SPEED.name], "not tested")
    assert CONVERGENCE.name not in v.index


def test_recurrent_and_windowed_hybrids_form_one_family(tmp_path):
    """A Mamba-2 hybrid beside SWA hybrids of the same pattern and full layers is in their family; two
    families (RoPE and NoPE full layers) give one speed test each, named by what the family shares."""
    arm(tmp_path, "w16", 3, window=16, score=fast)
    arm(tmp_path, "m", 3, mixer="mamba2", score=slow)
    arm(tmp_path, "w16n", 3, window=16, pos_full="nope", score=fast)
    arm(tmp_path, "w64n", 3, window=64, pos_full="nope", score=fast)
    tests = verdicts(tmp_path)
    speeds = sorted(t for t in tests.index if t.startswith("speed (probes)"))
    assert speeds == ["speed (probes): pos.full=rope", "speed (probes): swa pos.full=nope"], speeds
    assert "mamba2" in tests.loc["speed (probes): pos.full=rope", "compared"]


def test_analyze_findings_states_effect_ci_p_and_seeds(tmp_path, capsys):
    """The command line prints the verdict table; report.md holds it with the details below; the CSVs
    hold every number."""
    arm(tmp_path / "runs", "fast", 5, window=16, score=fast)
    arm(tmp_path / "runs", "slow", 5, window=64, score=slow)
    assert main(["analyze", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--findings"]) == 0
    printed = capsys.readouterr().out
    assert ("| 1. emergence speed | speed (probes) | reproduced | 320 tokens [320, 320] | 0.00794 (0.0317) "
            "| 5/5 |" in printed)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| effect [95% CI] | p (Holm) | seeds per arm |" in report and "### Details" in report
    assert ("  - W=64 - W=16: restricted mean tokens among the arms every run of which emerged: 320 tokens "
            "[95% CI 320, 320], "
            "p 0.00794, Holm 0.0317, "
            "seeds 5/5: reproduced") in report
    tests = pd.read_csv(tmp_path / "out" / "findings.csv")
    assert {"effect", "ci_low", "ci_high", "p", "p_holm", "seeds", "reason"} <= set(tests.columns)
    comparisons = pd.read_csv(tmp_path / "out" / "findings_comparisons.csv")
    # speed among the arms that emerge, with all arms' restricted means as context; the share emerged, its own
    # claim; convergence: the gap at step 19, equivalence at 39, the movement from 29 to 39 (context), apart at 39
    assert comparisons["verdict"].tolist() == ["reproduced", "context", "inconclusive", "reproduced", "reproduced",
                                               "context", "inconclusive"]
    assert comparisons["compared"][2] == "W=64 - W=16: share of runs emerged by tau" and comparisons["effect"][2] == 0


def test_the_grid_declares_the_convergence_measure_and_margin(tmp_path):
    """The closing gap above at 5 seeds (reproduced within the default ±0.05 on the beyond-length score) under a
    grid's declarations: within ±0.001 the equal arms are not shown equivalent; on ``loss_gain`` (the fabricated
    answer loss is 1.0 in every run) there is no gap at mid to close. The evidence names the declared measure."""
    from hybrid_lightning.analysis.findings import findings
    from hybrid_lightning.analysis.report import analyze
    from hybrid_lightning.grid.schema import VerdictsSpec

    arm(tmp_path, "a", 5, window=16, score=lambda s: (0.6, 0.9 + 0.01 * s, 0.9 + 0.01 * s, 0.9 + 0.01 * s))
    arm(tmp_path, "b", 5, window=64, score=lambda s: (0.5, 0.6 + 0.01 * s, 0.9 + 0.01 * s, 0.9 + 0.01 * s))
    runs = load_runs(find_runs(tmp_path), root=tmp_path)

    def convergence(**spec):
        declared = VerdictsSpec.model_validate({"convergence": spec}).declared()
        return findings(runs, declared).set_index("test").loc["convergence (probes)"]

    assert_reproduced(convergence())
    assert "longctx/score_beyond arm means" in convergence()["evidence"]
    assert_verdict(convergence(margin=0.001), "inconclusive", "not shown within ±0.001")
    declared = VerdictsSpec.model_validate({"convergence": {"margin": 0.001}}).declared()
    analyze(tmp_path, tmp_path / "report", findings=True, declared=declared)  # as analyze --grid passes them
    assert pd.read_csv(tmp_path / "report" / "findings.csv").set_index("test").loc[
        "convergence (probes)", "reason"].startswith("not shown within ±0.001")
    by_loss = convergence(measure="loss_gain", margin=0.1)
    assert_verdict(by_loss, "inconclusive", "no gap shown at the declared step")
    assert "longctx/loss_gain arm means" in by_loss["evidence"]


def test_a_convergence_measure_without_a_margin_or_at_its_ceiling_is_refused(tmp_path, capsys):
    """A grid declaring ``loss_gain`` (no default margin) or the within-length token score (at its ceiling once
    the arms have risen) is refused before anything runs, naming the key."""
    import yaml

    for spec, said in (({"measure": "loss_gain"}, "verdicts.convergence: loss_gain has no default equivalence margin"),
                       ({"measure": "score"}, "verdicts.convergence.measure"),
                       ({"margin": 0}, "verdicts.convergence.margin"),
                       ({"measur": "loss_gain"}, "unknown grid key 'verdicts.convergence.measur'")):
        path = tmp_path / "grid.yaml"
        path.write_text(yaml.safe_dump({"name": "g", "axes": {"seed": [0]}, "verdicts": {"convergence": spec}}))
        assert main(["grid", "plan", str(path), "--verdicts"]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1, err
