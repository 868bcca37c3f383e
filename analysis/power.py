"""Power of the findings' tests, by simulation, for the design check (analysis/design.py): the share of
simulated experiments in which a test passes its verdict rule at a level, for a given number of seeds per
arm, and the fewest seeds per arm that reach ``TARGET`` power.

Each simulation draws ``REPLICATIONS`` experiments from an effect model and runs the test's own statistic
against its permutation distribution with the verdicts' own permutation test (analysis/permutation.py: the
same relabellings, so a simulated experiment gets the p its runs would get): two arms, the difference of means
(two-sided p, and Welch's 95% interval on the predicted side of 0, as ``stats.Comparison.verdict`` asks);
more arms, their ``permutation.spread``; censored times, the log-rank z (``survival.logrank_statistic``);
equivalence, ``stats.tost``.

Effect models (``Model``): ``normal`` (arm means ``shift`` seed standard deviations apart), ``censored``
(first-event times normal in units of the budget, observed at the evaluation steps and censored at the end),
and ``resampled`` (each arm's values drawn with replacement from a pilot's runs: the effect and variance the
pilot showed). Every draw comes from ``np.random.default_rng(SEED)``: the same design gives the same numbers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats as st

from hybrid_lightning.analysis.permutation import SEED, permutation_p, permutation_test, spread
from hybrid_lightning.analysis.stats import tost
from hybrid_lightning.analysis.survival import logrank_statistic

REPLICATIONS = 400  # simulated experiments per power estimate: its standard error at 0.8 is 0.02
TARGET = 0.8
MAX_SEEDS = 30  # the search for the seeds that reach TARGET stops here
DEFAULT_EFFECT = 1.5  # seed standard deviations: the default effect of every test with a model (analysis/design.py)
START, SPREAD = 0.4, 0.15  # censored model: the earliest arm's mean event time and the seeds' SD, shares of the budget

# draw(rng, sizes) -> one (REPLICATIONS, n) array per arm (for censored times: a (times, events) pair of them)
Draw = Callable[[np.random.Generator, list[int]], list]
Simulate = Callable[[list[int], float], float]  # (seeds per arm, alpha) -> power


@dataclass(frozen=True)
class Model:
    """An effect model, in words (``text``) and as ``draw``."""

    text: str
    draw: Draw


def normal(shifts: list[float]) -> Model:
    """Arm i's seeds normal with mean ``shifts[i]`` and standard deviation 1."""
    def draw(rng, sizes):
        return [rng.normal(m, 1.0, (REPLICATIONS, n)) for m, n in zip(shifts, sizes)]
    return Model(f"normal seeds, arm means {', '.join(f'{s:g}' for s in shifts)} seed SDs", draw)


def censored(shifts: list[float], steps: np.ndarray) -> Model:
    """Arm i's event times normal with mean ``START + shifts[i] * SPREAD`` and SD ``SPREAD`` (shares of the
    budget), each seen at the first of ``steps`` (shares, ascending, the last 1) at or after it; censored at 1."""
    def draw(rng, sizes):
        out = []
        for m, n in zip(shifts, sizes):
            t = rng.normal(START + m * SPREAD, SPREAD, (REPLICATIONS, n))
            seen = steps[np.minimum(np.searchsorted(steps, t), len(steps) - 1)]
            out.append((np.where(t <= 1, seen, 1.0), t <= 1))
        return out
    return Model(f"event times normal, SD {SPREAD:g} of the budget, arm means "
                 + ", ".join(f"{START + s * SPREAD:.3g}" for s in shifts) + " of it, censored at its end", draw)


def resampled(samples: list, text: str) -> Model:
    """Each arm's seeds drawn with replacement from ``samples[i]`` (values, or a (times, events) pair)."""
    def draw(rng, sizes):
        out = []
        for sample, n in zip(samples, sizes):
            if isinstance(sample, tuple):
                i = rng.integers(0, len(sample[0]), (REPLICATIONS, n))
                out.append((np.asarray(sample[0], float)[i], np.asarray(sample[1], bool)[i]))
            else:
                out.append(np.asarray(sample, float)[rng.integers(0, len(sample), (REPLICATIONS, n))])
        return out
    return Model(text, draw)


def welch_excludes_zero(a: np.ndarray, b: np.ndarray, sign: int) -> np.ndarray:
    """Per replication, whether Welch's 95% interval of mean(b) - mean(a) lies on the ``sign`` side of 0
    (either side for 0); seeds that do not vary give the point."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # scipy's precision warning where seeds barely differ
        ci = st.ttest_ind(b, a, axis=1, equal_var=False).confidence_interval(0.95)
    point = (np.ptp(a, axis=1) == 0) & (np.ptp(b, axis=1) == 0)
    low = np.where(point, b.mean(axis=1) - a.mean(axis=1), ci.low)
    high = np.where(point, low, ci.high)
    return {1: low > 0, -1: high < 0, 0: (low > 0) | (high < 0)}[sign]


def passes_means(arms: list[np.ndarray], alpha: float, sign: int) -> np.ndarray:
    """Per replication, whether the arms differ as the verdict rule asks (two arms: p < alpha, the expected
    sign and the interval excluding 0; more: the spread's p < alpha); p as the verdicts compute it
    (``permutation.permutation_p``, the replications at once)."""
    if len(arms) > 2:
        return permutation_p(arms, spread, upper=True) < alpha
    p, effect = permutation_p(arms), arms[1].mean(axis=1) - arms[0].mean(axis=1)
    return (p < alpha) & ((np.sign(effect) == sign) | (sign == 0)) & welch_excludes_zero(arms[0], arms[1], sign)


def logrank_passes(a: tuple, b: tuple, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Per replication, (the log-rank permutation p < alpha with b later than a, b's restricted mean - a's > 0);
    the p of ``survival.logrank``."""
    z, p = permutation_test([np.stack(a, axis=1), np.stack(b, axis=1)], logrank_statistic)  # arms (R, 2, n)
    events = a[1].any(axis=1) | b[1].any(axis=1)  # no event at all: no p (the verdict's NaN)
    later = b[0].mean(axis=1) > a[0].mean(axis=1)
    return events & (p < alpha) & (z > 0) & later & welch_excludes_zero(a[0], b[0], 1), later


def equivalent(a: np.ndarray, b: np.ndarray, margin: float, alpha: float) -> np.ndarray:
    """Per replication, whether ``stats.tost`` shows the arms equivalent within ``margin`` at ``alpha``."""
    return tost(a, b, margin)[0] < alpha


def seeds_for(power: Callable[[int], float], target: float = TARGET) -> int | None:
    """The fewest seeds per arm (1 to ``MAX_SEEDS``) whose ``power`` reaches ``target`` (power taken as rising
    with the seeds: bisection); None where even ``MAX_SEEDS`` falls short."""
    if power(MAX_SEEDS) < target:
        return None
    if power(1) >= target:  # a test that one seed per arm can pass (a scaling law's, over sizes and budgets)
        return 1
    low, high = 1, MAX_SEEDS  # power(low) < target <= power(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if power(mid) >= target else (mid, high)
    return high


def rng() -> np.random.Generator:
    return np.random.default_rng(SEED)
