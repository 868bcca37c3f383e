"""Finding 1, emergence (analysis/findings.py): within each family of hybrids that differ only in their
efficient layers (analysis/arms.py), how fast each architecture's probe score rises above noise (whether
the architectures draw together by the end of the budget is analysis/convergence.py's).

Signal level. A run's score counts as above noise at an evaluation where it is at least ``SIGNAL_Z`` of its
own null standard errors, ``longctx/score_se`` (analysis/scores.py: the binomial error of the answer
tokens at chance, a null with known sampling error); a run without one never counts. An architecture's seed
mean counts at ``SIGNAL_Z`` standard errors of a mean of its seeds. At z = 3 a run that learns nothing
crosses at one evaluation with probability 0.0013 (normal approximation), at one of 20 about 0.03.

*Speed* is a time-to-event test among the family's arms. Each run's event is the first evaluation at its
level, in training tokens; a run that never gets there is right-censored at its last evaluation, never
dropped and never counted as a win; all runs are censored at the family's earliest last evaluation (tau), so
that each arm's restricted mean time (the area under its Kaplan-Meier curve up to tau) is the mean of
min(time, tau) over its seeds. Whether each arm emerges (its runs with an event) is reported apart from how
fast (restricted mean, Kaplan-Meier median). Two claims, each its own test, never one for the other:
*faster among the arms that emerge* (``SPEED``): the restricted means of the arms every run of which emerged
by tau (two arms: their difference, Welch's interval, permutation p; more: the permutation p of the spread of
their means, with their standard deviation as the effect, no pair singled out; not testable with fewer than
two such arms); *emerges in more runs* (``EMERGES``): the share of runs with the event by tau, among all the
family's arms. Beside the first, as context: the restricted means of all arms, which mix the two.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import power as pw
from hybrid_lightning.analysis import stats
from hybrid_lightning.analysis.arms import Family, families
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.metrics import SCORE, SCORE_SE
from hybrid_lightning.analysis.stats import Comparison, Test
from hybrid_lightning.analysis.survival import km_median
from hybrid_lightning.analysis.verdict import Design, Models, Planned, Verdict, arms_floor, at_least, complete
from hybrid_lightning.records import Tag
from hybrid_lightning.units import si

SIGNAL_Z = 3.0  # null standard errors above chance that count as a signal
NOT_TESTABLE = "not testable at this budget"
F = "1. emergence speed"


def speed_tests(runs: Runs) -> list[Test]:
    """The speed test of the probe score per family; not tested where there is no family or no score."""
    def judge(name, fam, values, tokens, level, _):
        return _speed(name, fam, values, tokens, level, share=False)
    return per_family(runs, SPEED, judge, missing=True)


def share_tests(runs: Runs) -> list[Test]:
    """The emergence-share test of the probe score per family with a score."""
    def judge(name, fam, values, tokens, level, _):
        return _speed(name, fam, values, tokens, level, share=True)
    return per_family(runs, EMERGES, judge, missing=False)


def per_family(runs: Runs, verdict: Verdict, judge, missing: bool) -> list[Test]:
    """``judge(name, family, values, tokens, level, errors)`` per family with a run above its noise level (the
    run x step scores and tokens, each run's level, the runs' null standard errors); ``no signal`` for a
    family without one; with ``missing``, ``not tested`` where there is no family or no score."""
    fams, metrics = families(runs.configs), runs.metrics
    if not fams:
        why = "no two architectures are hybrids that differ only in their efficient layers (window or efficient mixer)"
        return [Test(F, verdict.name, verdict="not tested", evidence=why)] if missing else []
    errors = metrics[metrics["metric"] == SCORE_SE].sort_values("step").groupby("run")["value"].last()
    errors = errors.where(errors > 0)  # no error estimate (or none above 0): the run never counts as above noise
    scores, out = metrics[metrics["metric"] == SCORE], []
    for fam in fams:
        name = verdict.named(fam.name if len(fams) > 1 else "")
        d = scores[scores["run"].isin([r for runs in fam.runs.values() for r in runs])]
        if d.empty:
            out += [Test(F, name, verdict="not tested", evidence=f"no run of {', '.join(fam.labels)} has logged the "
                         "score")] if missing else []
            continue
        values = d.pivot_table(index="run", columns="step", values="value")  # run x step
        tokens = d.pivot_table(index="run", columns="step", values="tokens")
        level = SIGNAL_Z * errors.reindex(values.index)  # per run; NaN compares as never reached
        if not values.ge(level, axis=0).any(axis=None):
            text = (f"no run of {', '.join(fam.labels)} reaches {SIGNAL_Z:g} null standard errors (level up to "
                    f"{level.max():.3f})")
            out.append(Test(F, name, verdict="no signal", evidence=text))
            continue
        out.append(judge(name, fam, values, tokens, level, errors))
    return out


def event_times(values: pd.DataFrame, tokens: pd.DataFrame, level: pd.Series) -> tuple[pd.Series, pd.Series, float]:
    """(time, event, tau) per run of ``values`` (run x step scores, ``tokens`` alike): the tokens of the first
    evaluation at the run's ``level``, else of its last evaluation (censored); all censored at tau, the
    earliest last evaluation, so that the mean of ``time`` over an arm's seeds is its restricted mean."""
    above, seen = values.ge(level, axis=0).to_numpy(), values.notna().to_numpy()
    rows, last = np.arange(len(values)), seen.shape[1] - 1 - seen[:, ::-1].argmax(axis=1)  # each run's last evaluation
    hit = above.any(axis=1)
    time = np.where(hit, tokens.to_numpy()[rows, above.argmax(axis=1)], tokens.to_numpy()[rows, last])
    tau = float(tokens.to_numpy()[rows, last].min())
    return pd.Series(np.minimum(time, tau), values.index), pd.Series(hit & (time <= tau), values.index), tau


def _speed(test: str, fam: Family, values: pd.DataFrame, tokens: pd.DataFrame, level: pd.Series, share: bool) -> Test:
    """The claim "faster among the arms that emerge" (the restricted means of the arms every run of which emerged
    by tau; not testable with fewer than two such arms) or, with ``share``, "emerges in more runs" (the share
    of runs with the event by tau, among all the family's arms): two claims, each its own test."""
    time, event, tau = event_times(values, tokens, level)
    samples = {label: time.reindex(runs).dropna().to_numpy(float) for label, runs in fam.runs.items()}
    events = {label: event.reindex(runs).fillna(False).astype(bool) for label, runs in fam.runs.items()}
    parts = []
    for label, runs in fam.runs.items():
        median, ci = km_median(time.reindex(runs), events[label]), stats.mean_ci(samples[label])
        parts.append(f"{label}: emerged in {int(events[label].sum())}/{len(runs)} runs; restricted mean "
                     f"{si(samples[label].mean())} [{_si(ci[0])}, {_si(ci[1])}], Kaplan-Meier median "
                     f"{'not reached' if math.isnan(median) else si(median)}")
    never = [label for label, e in events.items() if not e.any()]
    note = (f". Never emerged by tau: {', '.join(never)} (their times are only known to exceed tau)" if never else "")
    evidence = (f"family {fam.name}: event: the first evaluation at {SIGNAL_Z:g} null standard errors (level "
                f"{level.min():.3f} to {level.max():.3f}), censored at the run's last evaluation and at tau = "
                f"{si(tau)} tokens; " + "; ".join(parts) + note)
    # context, deciding nothing: the restricted means of all arms, which mix how fast with whether they emerge
    mixed = Comparison.among("restricted mean tokens to emergence, all arms (speed and share mixed)", samples, "tokens")
    mixed.claim = False
    shares = {k: e.to_numpy(float) for k, e in events.items()}
    every = {label: samples[label] for label, e in events.items() if e.all()}
    if len(every) < 2:
        why = f"{len(every)} arm(s) of the family emerged in every run by tau: no two to compare how fast"
        faster = Test(F, test, [mixed], evidence, combine=lambda d: (d[0][0], NOT_TESTABLE, why))
    else:
        faster = Test(F, test, [Comparison.among("restricted mean tokens among the arms every run of which emerged",
                                                 every, "tokens"), mixed], evidence, combine=lambda d: d[0])
    return Test(F, test, [Comparison.among("share of runs emerged by tau", shares)], evidence) if share else faster


def _si(v: float) -> str:
    return "nan" if math.isnan(v) else si(v)


def _retrieval_acc(runs: Runs) -> list[Test]:
    """``val/retrieval_acc`` has no null with known sampling error (its answer tokens are not counted in the
    run's records), so no level tells its rise from noise: stated where runs log it, never tested."""
    if not runs.metrics["metric"].eq(Tag.RETRIEVAL_ACC).any():
        return []
    return [Test(F, RETRIEVAL_ACC.name, verdict="not tested",
                 reason="no null with known sampling error: the runs do not record how many answer tokens it is over",
                 evidence="its curves are in the report; emergence is judged on the probe score, whose null standard "
                          "error is binomial")]


def _plan_speed(d: Design, models: Models) -> list[Planned]:
    out, fams = [], families(d.configs)
    for fam in fams:
        labels = list(fam.labels)
        effect, simulate = models(SPEED, labels, d.steps(labels[0], "eval"))
        out.append(Planned(F, SPEED.named(fam.name if len(fams) > 1 else ""), f"{len(labels)} arms: "
                           + ", ".join(labels), labels, d.seeds(labels), lambda s: at_least(s, [arms_floor(s)]),
                           simulate, effect, why=d.untimed(labels[0], "eval")))
    return out


def _plan_share(d: Design, _: Models) -> list[Planned]:
    """The share of runs that emerge, among the family's arms: floor at complete separation (an arm's runs all
    emerged, the others' none; for more arms the arms' floor, a bound below the 0/1 values' own)."""
    out, fams = [], families(d.configs)
    for fam in fams:
        labels = list(fam.labels)

        def floor(s: list[int]) -> list[float]:
            return at_least(s, [arms_floor(s)])

        out.append(Planned(F, EMERGES.named(fam.name if len(fams) > 1 else ""), f"share of runs emerged, {len(labels)} "
                           "arms", labels, d.seeds(labels), floor, complete(floor), "complete separation"))
    return out


def _speed_default(labels: list[str], steps: np.ndarray) -> pw.Model:
    """The last arm ``DEFAULT_EFFECT`` seed SDs later than the others (censored times)."""
    return pw.censored([0.0] * (len(labels) - 1) + [pw.DEFAULT_EFFECT], steps)


def _pilot_scores(pilot: Runs, runs: list[list[str]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The pilot's probe scores of ``runs`` (rows) and their metrics."""
    m = pilot.metrics
    d = m[(m["metric"] == SCORE) & m["run"].isin(sum(runs, []))]
    return d, d.pivot_table(index="run", columns="step", values="value")


def _speed_samples(pilot: Runs, runs: list[list[str]]) -> list | None:
    """Per arm, each run's restricted time to emergence as a share of the pilot's tau."""
    d, values = _pilot_scores(pilot, runs)
    m = pilot.metrics
    errors = m[m["metric"] == SCORE_SE].sort_values("step").groupby("run")["value"].last()
    level = SIGNAL_Z * errors.where(errors > 0).reindex(values.index)
    time, _, tau = event_times(values, d.pivot_table(index="run", columns="step", values="tokens"), level)
    times = [(time.reindex(r) / tau).to_numpy() for r in runs]
    return None if any(np.isnan(t).any() for t in times) else times


SPEED = Verdict(F, "speed (probes)", speed_tests, _plan_speed, _speed_default,
                lambda arms, alpha: pw.passes_means([a[0] if isinstance(a, tuple) else a for a in arms], alpha, 0),
                _speed_samples)
EMERGES = Verdict(F, "emerges in more runs (probes)", share_tests, _plan_share)
RETRIEVAL_ACC = Verdict(F, "speed (val/retrieval_acc rise)", _retrieval_acc)
