"""Statistics over seeds for the findings' verdicts (analysis/findings.py): a seeded bootstrap CI, exact
or Monte-Carlo permutation tests, Holm's adjustment, and the verdict rule.

The unit of replication is the seed: each run gives one value (or one row of values, e.g. a score at
two steps) and an *arm* is the runs of one architecture. Every function is deterministic: random draws
come from ``np.random.default_rng(SEED)``, so a report is reproduced exactly from the same runs.

A permutation test of two arms of n and m seeds cannot give a p below 2 / C(n + m, n) (two-sided): 0.33
at 2 and 2 seeds, 0.10 at 3 and 3, 0.029 at 4 and 4, 0.0079 at 5 and 5; Holm's adjustment multiplies the
smallest p of a finding's k tests by k. ``min_p`` gives this floor so that a verdict can say when more
seeds, not a larger effect, are what it lacks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SEED = 0  # of every random draw here, so that reports are reproducible
BOOTSTRAP = 10_000  # bootstrap resamples
PERMUTATIONS = 20_000  # Monte-Carlo relabellings where the exact enumeration would be longer than EXACT_LIMIT
EXACT_LIMIT = 50_000
ALPHA = 0.05
MIN_SEEDS = 3  # per compared arm, for a verdict other than inconclusive

# statistic(x, groups): x (B, N, ...) B arrangements of the N runs' rows, groups (N,) the fixed group code of
# each position (0, 1, ...; sorted) -> (B,)
Statistic = Callable[[np.ndarray, np.ndarray], np.ndarray]


def mean_difference(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Mean of group 0 minus mean of group 1, of 1-d rows: (B, N) -> (B,)."""
    return x[:, groups == 0].mean(axis=1) - x[:, groups == 1].mean(axis=1)


def rank_correlation(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Spearman correlation between the group code (an ordered factor, e.g. the window's rank) and the
    value; ties get their average rank; NaN where the values are all equal. (B, N) -> (B,)."""
    rx, rg = _ranks(x), _ranks(groups[None].astype(float))
    rx, rg = rx - rx.mean(axis=1, keepdims=True), rg - rg.mean(axis=1, keepdims=True)  # (B, N), (1, N)
    denominator = np.sqrt((rx ** 2).sum(axis=1) * (rg ** 2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (rx * rg).sum(axis=1) / denominator, np.nan)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks along axis 1 (ties share the mean of their ranks): (B, N) -> (B, N)."""
    order = np.argsort(x, axis=1, kind="stable")
    ranks = np.empty_like(x, dtype=float)
    np.put_along_axis(ranks, order, np.arange(x.shape[1], dtype=float)[None].repeat(len(x), 0), axis=1)
    out = ranks.copy()
    for b in range(len(x)):  # ties: few runs, so a loop over distinct values is cheap
        values, inverse, counts = np.unique(x[b], return_inverse=True, return_counts=True)
        if len(values) < x.shape[1]:
            out[b] = np.bincount(inverse, weights=ranks[b])[inverse] / counts[inverse]
    return out


def _arrange(arms: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of every arm stacked (N, ...) and their group codes (N,)."""
    x = np.concatenate([np.asarray(a, dtype=float) for a in arms])
    groups = np.repeat(np.arange(len(arms)), [len(a) for a in arms])
    return x, groups


def bootstrap_ci(arms: list[np.ndarray], statistic: Statistic = mean_difference, level: float = 0.95,
                 resamples: int = BOOTSTRAP) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic``, resampling seeds with replacement within each arm.

    Args:
        arms: one array per arm, a row per seed (1-d: one value per seed).
        statistic: see ``Statistic``.
        level: coverage of the interval.
        resamples: bootstrap resamples (drawn from ``default_rng(SEED)``).
    Returns: (low, high); NaN where every resample's statistic is undefined.
    """
    x, groups = _arrange(arms)
    rng = np.random.default_rng(SEED)
    starts = np.concatenate([[0], np.cumsum([len(a) for a in arms])])
    index = np.concatenate([rng.integers(lo, hi, size=(resamples, hi - lo)) for lo, hi in zip(starts, starts[1:])], axis=1)
    values = statistic(x[index], groups)
    values = values[~np.isnan(values)]
    if not len(values):
        return math.nan, math.nan
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def mean_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of one arm's seeds; NaN with fewer than two values or any NaN."""
    if len(values) < 2 or np.isnan(values).any():
        return math.nan, math.nan
    return bootstrap_ci([values], lambda x, groups: x.mean(axis=1), level)


def permutation_p(arms: list[np.ndarray], statistic: Statistic = mean_difference, upper: bool = False) -> float:
    """Permutation p of ``statistic`` under the null that the arms are exchangeable, from its values over the
    relabellings of the runs to the arms (arm sizes kept): two-sided (``_tail_p``), or with ``upper`` the
    share at or above the observed value (for a statistic that is large for any difference, e.g. a spread).
    Exact (every distinct relabelling once) up to ``EXACT_LIMIT`` relabellings, else ``PERMUTATIONS`` random
    ones counted with the observed one, (1 + hits) / (1 + draws), which keeps the test valid (Phipson &
    Smyth 2010, https://arxiv.org/abs/1603.05766).

    Returns: p in (0, 1]; NaN where the observed statistic is undefined.
    """
    x, groups = _arrange(arms)
    observed = statistic(x[None], groups)[0]
    if np.isnan(observed):
        return math.nan
    sizes = [len(a) for a in arms]
    if _relabellings(sizes) <= EXACT_LIMIT:
        orders = np.array(list(_orders(list(range(len(x))), sizes)))
        extra = 0
    else:
        rng = np.random.default_rng(SEED)
        orders = np.array([rng.permutation(len(x)) for _ in range(PERMUTATIONS)])
        extra = 1
    return _tail_p(statistic(x[orders], groups), observed, extra, upper)


def stratified_p(strata: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Two-sided permutation p (``_tail_p``) for "the marked items of each run are like any others of that run". Each
    stratum (one run) is (values (n,), marked (n,) bool); the statistic is the mean over runs of (mean of the
    marked values - mean of all values), and the null distribution comes from moving the marks among the
    items of each run, keeping their number (e.g. which heads are retrieval heads, or which of a run's head
    maskings is the top-K one among its random draws). Exact over every combination up to
    ``EXACT_LIMIT``, else Monte-Carlo as in ``permutation_p``.

    Returns: p in (0, 1]; NaN without a stratum that has marked and unmarked items.
    """
    strata = [(np.asarray(v, dtype=float), np.asarray(m, dtype=bool)) for v, m in strata]
    strata = [(v, m) for v, m in strata if 0 < m.sum() < len(m)]
    if not strata:
        return math.nan
    observed = np.mean([v[m].mean() - v.mean() for v, m in strata])
    if math.prod(math.comb(len(v), int(m.sum())) for v, m in strata) <= EXACT_LIMIT:
        values, extra = np.zeros(1), 0
        for v, m in strata:  # every combination's statistic: the outer sum of the strata's terms
            terms = np.array([v[list(c)].mean() for c in itertools.combinations(range(len(v)), int(m.sum()))]) - v.mean()
            values = np.add.outer(values, terms).ravel()
        values = values / len(strata)
    else:
        rng = np.random.default_rng(SEED)
        values, extra = np.zeros(PERMUTATIONS), 1
        for v, m in strata:
            marks = rng.permuted(np.tile(m, (PERMUTATIONS, 1)), axis=1)  # (draws, n)
            values += (marks * v).sum(axis=1) / m.sum() - v.mean()
        values = values / len(strata)
    return _tail_p(values, observed, extra)


def _tail_p(values: np.ndarray, observed: float, extra: int, upper: bool = False) -> float:
    """The p of ``observed`` among the null ``values`` of the statistic: with ``upper`` the share at or above
    it, else two-sided, twice the smaller tail capped at 1 (which suits null distributions that are not
    symmetric, unlike counting |values| >= |observed|). ``extra``: 1 for Monte-Carlo values (the observed
    arrangement counted among them), 0 for an exact enumeration."""
    tolerance = 1e-12 * max(1.0, abs(observed))  # equal statistics computed in another order count as equal
    above = (np.sum(values >= observed - tolerance) + extra) / (len(values) + extra)
    if upper:
        return float(above)
    below = (np.sum(values <= observed + tolerance) + extra) / (len(values) + extra)
    return float(min(1.0, 2 * min(above, below)))


def _relabellings(sizes: list[int]) -> int:
    """Distinct assignments of sum(sizes) runs to arms of these sizes (a multinomial coefficient)."""
    return math.factorial(sum(sizes)) // math.prod(math.factorial(s) for s in sizes)


def _orders(items: list[int], sizes: list[int]):
    """Every distinct assignment of ``items`` to consecutive arms of ``sizes``, as one order of the items
    (the first sizes[0] go to arm 0, and so on)."""
    if len(sizes) == 1:
        yield tuple(items)
        return
    for first in itertools.combinations(items, sizes[0]):
        rest = [i for i in items if i not in first]
        for tail in _orders(rest, sizes[1:]):
            yield first + tail


def min_p(n: int, m: int) -> float:
    """The smallest two-sided p a permutation test of two arms of n and m seeds can give."""
    return min(1.0, 2 / math.comb(n + m, n))


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment of p values for a family of tests (Holm 1979, "A simple sequentially
    rejective multiple test procedure", Scand. J. Statist. 6:65-70): the i-th smallest of m p values is
    multiplied by (m - i + 1), made non-decreasing, capped at 1. Rejecting the adjusted p < alpha keeps the
    family-wise error rate at alpha. NaN entries are left out of the family and stay NaN."""
    ps = [float(p) for p in ps]
    kept = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    out, running = [math.nan] * len(ps), 0.0
    for rank, (p, i) in enumerate(kept):
        running = max(running, min(1.0, (len(kept) - rank) * p))
        out[i] = running
    return out


@dataclass
class Comparison:
    """One test of a finding: the effect over seeds, its bootstrap CI and permutation p.

    what: what is compared, in words (e.g. ``swa W=16 - full``).
    effect: the statistic on the runs (for ``mean_difference``, arm 0 minus arm 1).
    expected: the sign of the effect the finding predicts (+1, -1), or 0 where it predicts only a difference.
    seeds: seeds per arm.
    unit: the effect's unit, for the text (``tokens``, ``nats``, ...).
    p_adj: set by ``adjust`` (Holm over the tests of one finding).
    """

    what: str
    effect: float
    ci: tuple[float, float]
    p: float
    expected: int
    seeds: tuple[int, ...]
    unit: str = ""
    p_adj: float = math.nan

    @classmethod
    def of(cls, what: str, arms: list[np.ndarray], expected: int, statistic: Statistic = mean_difference,
           unit: str = "") -> Comparison:
        """Effect, bootstrap CI and permutation p of ``statistic`` over the seeds of ``arms``."""
        x, groups = _arrange(arms)
        effect = float(statistic(x[None], groups)[0])
        return cls(what, effect, bootstrap_ci(arms, statistic), permutation_p(arms, statistic), expected,
                   tuple(len(a) for a in arms), unit)

    @classmethod
    def paired(cls, what: str, differences: np.ndarray, p: float, expected: int, unit: str = "") -> Comparison:
        """Per-seed differences (one arm of seeds): their mean and its bootstrap CI, with ``p`` from a test
        made elsewhere (e.g. ``stratified_p``)."""
        d = np.asarray(differences, dtype=float)
        return cls(what, float(d.mean()), bootstrap_ci([d], lambda x, g: x.mean(axis=1)), p, expected, (len(d),), unit)

    def verdict(self) -> tuple[str, str]:
        """(verdict, reason): ``reproduced`` with at least ``MIN_SEEDS`` seeds per arm and Holm-adjusted
        p < ``ALPHA`` in the expected direction (any direction where none is expected); ``refuted`` when it is
        significant in the opposite direction; else ``inconclusive`` with the reason."""
        if min(self.seeds) < MIN_SEEDS:
            return "inconclusive", f"too few seeds ({min(self.seeds)} in an arm; the rule needs {MIN_SEEDS})"
        if math.isnan(self.p_adj):
            return "inconclusive", "the effect is undefined on these runs"
        if self.p_adj < ALPHA:
            agrees = self.expected == 0 or np.sign(self.effect) == self.expected
            return ("reproduced", "") if agrees else ("refuted", "significant in the opposite direction")
        if self.ci[0] <= 1e-12 and self.ci[1] >= -1e-12:  # rounding: a CI of exactly 0 may come out as -3e-17
            return "inconclusive", "CI spans 0"
        floor = min_p(*self.seeds) if len(self.seeds) == 2 else 0.0
        return "inconclusive", (f"adjusted p {self.p_adj:.3g} >= {ALPHA}" + (
            f"; with {seeds_text(self.seeds)} seeds no p can fall below {floor:.2g}" if floor >= ALPHA else ""))


def adjust(comparisons: list[Comparison]) -> None:
    """Sets each comparison's ``p_adj``: Holm over the list (the tests of one finding)."""
    for c, p in zip(comparisons, holm([c.p for c in comparisons])):
        c.p_adj = p


def seeds_text(seeds: tuple[int, ...]) -> str:
    """Seeds per arm: ``5/5``, or for more than 3 arms ``3-5 (12 arms)``."""
    if len(seeds) <= 3:
        return "/".join(map(str, seeds))
    spread = str(min(seeds)) if min(seeds) == max(seeds) else f"{min(seeds)}-{max(seeds)}"
    return f"{spread} ({len(seeds)} arms)"
