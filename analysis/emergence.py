"""Finding 1, emergence (analysis/findings.py): how fast each architecture's score rises above noise, and
whether the architectures draw together once every one has risen.

Signal level. A run's score counts as above noise at an evaluation where it is at least ``SIGNAL_Z`` of its
own null standard errors: for the probe score ``longctx/token_acc_se`` (analysis/scores.py, the binomial error
of the answer tokens at chance), for the rise of ``val/retrieval_acc`` (no error logged) the standard
deviation of the run's first ``START_VALIDATIONS`` validations; a run without an error estimate above 0
never counts as above noise. An architecture's seed mean counts at
``SIGNAL_Z`` standard errors of a mean of its seeds. At z = 3 a run that learns nothing crosses at one
evaluation with probability 0.0013 (normal approximation), at one of 20 evaluations about 0.03.

*Speed* is a time-to-event test. Each run's event is the first evaluation at its level, in training tokens;
a run that never gets there is right-censored at its last evaluation, never dropped and never counted as
a win; all runs are censored at the earliest last evaluation among them (``tau``), so that each arm's
restricted mean time to the event (the area under its Kaplan-Meier curve up to tau) is the mean of
min(time, tau) over its seeds. p: a permutation test of the spread of the arms' restricted means
(``_spread``) over relabellings of the seeds; effect: slowest minus fastest restricted mean, with
Welch's interval.

*Convergence* can only be seen after every architecture has risen: from the first common evaluation at
which every seed mean is at its level, the gap between the highest and the lowest architecture's seed mean
at its largest before the last common evaluation (the peak), minus the same two architectures' gap at the
last one (> 0: they draw together); per run its fall from the peak to the end, so that the effect is a
difference of two arms' means (Welch's interval, a permutation p). Beside it, whether those two differ at
the end. ``reproduced``: the fall is significant; ``refuted``: every
architecture has risen, the gap does not fall (the effect is at or below 0) and the two are significantly
apart at the end; ``not testable at this budget`` where an architecture never rises, where
every one has risen only at the last evaluation, or where the gap still grows significantly at the end
(the architectures are still diverging); otherwise inconclusive.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import stats, tables
from hybrid_lightning.analysis.stats import Comparison, Decided, Test
from hybrid_lightning.units import si

START_VALIDATIONS = 3  # the rise of val/retrieval_acc is over the mean of a run's first 3 validations
SIGNAL_Z = 3.0  # null standard errors above chance that count as a signal
NOT_TESTABLE = "not testable at this budget"
F = "1. emergence speed"


def emergence(metrics: pd.DataFrame, score: str, se: str, retrieval: str) -> list[Test]:
    """The speed and convergence tests of the probe score ``score`` (null errors ``se``) and of the rise of
    ``retrieval`` over each run's first validations."""
    errors = metrics[metrics["metric"] == se].sort_values("step").groupby("run")["value"].last()
    tests = _emergence_of(metrics, score, "probes", errors)
    acc = metrics[metrics["metric"] == retrieval].sort_values("step")
    first = acc.groupby("run")["value"]
    start = first.transform(lambda v: v.iloc[:START_VALIDATIONS].mean())
    noise = first.agg(lambda v: v.iloc[:START_VALIDATIONS].std(ddof=1))
    rise = acc.assign(value=acc["value"] - start)
    return tests + _emergence_of(rise, retrieval, "val/retrieval_acc rise", noise)


def _emergence_of(metrics: pd.DataFrame, tag: str, what: str, errors: pd.Series) -> list[Test]:
    curve = tables.curves(metrics, tag)
    if curve.empty:
        return [Test(F, f"speed ({what})", verdict="not tested", evidence=f"no run has logged {tag}")]
    d = metrics[metrics["metric"] == tag].merge(curve[["label", "step"]], on=["label", "step"])
    values = d.pivot_table(index="run", columns="step", values="value")  # run x step, steps every seed of its arm has
    tokens = d.pivot_table(index="run", columns="step", values="tokens")
    arms = {label: sorted(g["run"].unique()) for label, g in d.groupby("label")}
    errors = errors.where(errors > 0)  # no error estimate (or none above 0): the run never counts as above noise
    level = SIGNAL_Z * errors.reindex(values.index)  # per run; NaN compares as never reached
    final = curve.sort_values("step").groupby("label").last()["mean"]
    finals = ", ".join(f"{label}: {v:.3f}" for label, v in final.sort_values(ascending=False).items())
    if not values.ge(level, axis=0).any(axis=None):
        text = f"no run reaches {SIGNAL_Z:g} null standard errors (level up to {level.max():.3f}); finals {finals}"
        return [Test(F, f"speed ({what})", verdict="no signal", evidence=text),
                Test(F, f"convergence ({what})", verdict="no signal", evidence=text)]
    return [_speed(what, values, tokens, arms, level), _convergence(what, values, arms, errors, finals)]


def _speed(what: str, values: pd.DataFrame, tokens: pd.DataFrame, arms: dict[str, list[str]], level: pd.Series) -> Test:
    test = f"speed ({what})"
    if len(arms) < 2:
        return Test(F, test, verdict="not tested", evidence="fewer than two architectures")
    above = values.ge(level, axis=0).to_numpy()
    seen = values.notna().to_numpy()
    last = seen.shape[1] - 1 - seen[:, ::-1].argmax(axis=1)  # each run's last evaluation
    rows = np.arange(len(values))
    hit = above.any(axis=1)
    time = np.where(hit, tokens.to_numpy()[rows, above.argmax(axis=1)], tokens.to_numpy()[rows, last])
    tau = tokens.to_numpy()[rows, last].min()
    event = pd.Series(hit & (time <= tau), values.index)
    time = pd.Series(np.minimum(time, tau), values.index)
    samples = {label: time[runs].to_numpy(float) for label, runs in arms.items()}
    order = sorted(samples, key=lambda k: samples[k].mean())
    fastest, slowest = order[0], order[-1]
    comparison = Comparison(f"{slowest} - {fastest} (restricted mean)", float(samples[slowest].mean() - samples[fastest].mean()),
                            stats.interval(samples[slowest], samples[fastest]),
                            stats.permutation_p([samples[k] for k in order], _spread, upper=True), 0,
                            tuple(len(samples[k]) for k in order), "tokens")
    parts = []
    for k in order:
        runs, median = arms[k], stats.km_median(time[arms[k]], event[arms[k]])
        parts.append(f"{k}: {int(event[runs].sum())}/{len(runs)} reached, restricted mean {si(samples[k].mean())}, "
                     f"Kaplan-Meier median {'not reached' if math.isnan(median) else si(median)}")
    return Test(F, test, [comparison], f"event: the first evaluation at {SIGNAL_Z:g} null standard errors (level "
                f"{level.min():.3f} to {level.max():.3f}), censored at the run's last evaluation and at tau = {si(tau)} "
                f"tokens; " + "; ".join(parts) + f". p: spread of the {len(order)} restricted means under relabelling of seeds")


def _spread(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Between-architecture sum of squares of the arms' means (the one-way ANOVA numerator): (B, N) -> (B,)."""
    grand = x.mean(axis=1)
    return sum((groups == g).sum() * (x[:, groups == g].mean(axis=1) - grand) ** 2 for g in np.unique(groups))


def _convergence(what: str, values: pd.DataFrame, arms: dict[str, list[str]], errors: pd.Series, finals: str) -> Test:
    test = f"convergence ({what})"
    common = values.dropna(axis=1)
    steps = list(common.columns)
    if len(arms) < 2 or len(steps) < 2:
        return Test(F, test, verdict="not tested", evidence="fewer than two architectures or common evaluation steps")
    means = pd.DataFrame({k: common.loc[runs].mean() for k, runs in arms.items()})  # step x arm
    levels = pd.Series({k: SIGNAL_Z * math.sqrt((errors.reindex(runs) ** 2).mean(skipna=False) / len(runs))
                        for k, runs in arms.items()})
    risen = means.ge(levels, axis=1)
    late = [k for k in arms if not risen[k].any()]
    if late:
        return Test(F, test, verdict=NOT_TESTABLE, reason=f"{', '.join(late)} not above {SIGNAL_Z:g} standard errors "
                    f"by step {steps[-1]}", evidence=f"finals {finals}")
    start = max(int(risen[k].to_numpy().argmax()) for k in arms)  # index of the first step every arm has risen by
    window = steps[start:]
    if len(window) < 2:
        return Test(F, test, verdict=NOT_TESTABLE, reason=f"every architecture is above its level only at step "
                    f"{steps[-1]}, the last common evaluation", evidence=f"finals {finals}")
    gap = means.loc[window].max(axis=1) - means.loc[window].min(axis=1)  # step -> the highest arm mean minus the lowest
    peak = gap.iloc[:-1].idxmax()
    top, bottom = means.loc[peak].idxmax(), means.loc[peak].idxmin()
    # per run, its fall from the peak step to the end; the gap's fall is the top arm's mean fall minus the bottom's
    drop = {k: (common.loc[arms[k], peak] - common.loc[arms[k], steps[-1]]).to_numpy(float) for k in (top, bottom)}
    fall = Comparison.of(f"gap {top} - {bottom} at step {peak} - at step {steps[-1]}", [drop[top], drop[bottom]], +1)
    end = [common.loc[arms[k], steps[-1]].to_numpy(float) for k in (top, bottom)]
    apart = Comparison.of(f"{top} - {bottom} at step {steps[-1]}", end, 0)
    evidence = (f"every architecture above its level from step {window[0]}; gap between the highest and the lowest of "
                f"the {len(arms)} architectures' seed means: " + ", ".join(f"{s}: {v:.3f}" for s, v in gap.items())
                + f"; finals {finals}")
    return Test(F, test, [fall, apart], evidence, combine=_convergence_verdict)


def _convergence_verdict(decided: list[Decided]) -> Decided:
    """A significant fall of the gap reproduces; a significant growth is not testable (still diverging);
    no fall (effect <= 0) with the architectures significantly apart at the end refutes; else inconclusive."""
    (fall, verdict, reason), (apart, apart_verdict, _) = decided
    if verdict == "reproduced":
        return fall, verdict, reason
    if verdict == "refuted":
        return fall, NOT_TESTABLE, f"the gap still grows significantly at the end (adjusted p {fall.p_adj:.3g}): still diverging"
    if fall.effect <= 0 and apart_verdict == "reproduced":
        return fall, "refuted", (f"every architecture has risen, the gap does not fall and they stay apart at the end "
                                 f"(adjusted p {apart.p_adj:.3g})")
    return fall, "inconclusive", reason or "the gap falls, not significantly"
