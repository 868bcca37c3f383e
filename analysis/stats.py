"""Statistics over seeds for the findings' verdicts (analysis/findings.py): intervals whose coverage is
measured, exact or Monte-Carlo permutation tests, equivalence by two one-sided tests, Holm's adjustment,
and the verdict rule (censored times: analysis/survival.py). The tests and intervals are scipy.stats'; what
is written here is what scipy lacks (the stratified permutation test, Holm's adjustment, the verdict rule).

The unit of replication is the seed: each run gives one value (or one row of values, e.g. a score at
two steps) and an *arm* is the runs of one architecture. Every function is deterministic: random draws
come from ``np.random.default_rng(SEED)``, so a report is reproduced exactly from the same runs.

Intervals (95%): every effect is a difference of two arms' means (Welch's t interval,
``scipy.stats.ttest_ind`` with ``equal_var=False``) or one arm's mean of per-run values (the one-sample t
interval). Coverage simulated at 3 and 5 seeds per arm (tests/test_stats.py, normal seeds with unequal
variances, 2,000 draws each): Welch 0.954 / 0.946, one-sample t 0.947 / 0.950; the percentile bootstrap used
before covered 0.789 / 0.866, and scipy's BCa bootstrap of a spread of arm means (the earlier convergence
statistic, 200 draws) 0.78 / 0.81.

A permutation test of two arms of n and m seeds cannot give a p below 2 / C(n + m, n) (two-sided): 0.33
at 2 and 2 seeds, 0.10 at 3 and 3, 0.029 at 4 and 4, 0.0079 at 5 and 5; Holm's adjustment multiplies the
smallest p of a finding's k tests by k. ``min_p`` gives this floor so that a verdict can say when more
seeds, not a larger effect, are what it lacks.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as st

from hybrid_lightning.analysis import permutation
from hybrid_lightning.analysis.permutation import EXACT_LIMIT, PERMUTATIONS, SEED, Statistic, mean_difference, spread

ALPHA = 0.05
LEVEL = 0.95  # of every interval
MIN_SEEDS = 3  # per compared arm, for a verdict other than not testable
BY_DESIGN = "not testable"  # the verdict of a claim the design keeps from passing whatever the data


def interval(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """``LEVEL`` interval of mean(a) - mean(b) over seeds: Welch's t interval (``scipy.stats.ttest_ind``,
    ``equal_var=False``); the point where neither arm's seeds vary (the runs show no spread to widen it);
    NaN with fewer than two seeds in an arm."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) and len(b) and np.ptp(a) == 0 and np.ptp(b) == 0:
        return float(a[0] - b[0]), float(a[0] - b[0])
    if min(len(a), len(b)) < 2:
        return math.nan, math.nan
    with warnings.catch_warnings():  # scipy warns of precision loss where seeds differ by float32 rounding alone
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = st.ttest_ind(a, b, equal_var=False).confidence_interval(LEVEL)
    return float(ci.low), float(ci.high)


def mean_ci(values: np.ndarray) -> tuple[float, float]:
    """The one-sample t interval of the mean of one arm's seeds; the point where they do not vary; NaN with
    fewer than two values or any NaN."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2 or np.isnan(values).any():
        return math.nan, math.nan
    if np.ptp(values) == 0:
        return float(values[0]), float(values[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = st.ttest_1samp(values, 0.0).confidence_interval(LEVEL)
    return float(ci.low), float(ci.high)


def permutation_p(arms: list[np.ndarray], statistic: Statistic = mean_difference, upper: bool = False) -> float:
    """The permutation p of ``statistic`` over the arms' seeds (``permutation.permutation_p``: scipy's
    ``permutation_test`` over runs relabelled among the arms, exact up to ``EXACT_LIMIT`` relabellings, the
    planner's too): two-sided, or with ``upper`` the upper tail.

    Returns: p in (0, 1]; NaN where the observed statistic is undefined or an arm has one seed (no verdict
    rests on such an arm).
    """
    if min(len(a) for a in arms) < 2:
        return math.nan
    return permutation.permutation_p(arms, statistic, upper)


def sign_flip_p(differences: np.ndarray) -> float:
    """Two-sided p of "each difference is as likely negative as positive" (scipy's one-sample permutation test,
    the sign of every difference flipped; exact up to ``EXACT_LIMIT`` arrangements, else ``PERMUTATIONS`` draws)."""
    d = np.asarray(differences, dtype=float)
    resamples = np.inf if 2 ** len(d) <= EXACT_LIMIT else PERMUTATIONS
    return float(st.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=resamples,
                                     rng=np.random.default_rng(SEED)).pvalue)


def stratified_p(strata: list[tuple[np.ndarray, np.ndarray]], weights: list[float] | None = None) -> float:
    """Two-sided permutation p for "the marked items of each run are like any others of that run" (scipy has
    no stratified permutation test). Each stratum (one run) is (values (n,), marked (n,) bool); the statistic
    is the mean over runs of (mean of the marked values - mean of all values), weighted by ``weights`` where
    given (e.g. 1 / a run's checkpoints, so that each run counts once), and the null distribution comes from
    moving the marks among the items of each run, keeping their number (e.g. which of a run's head maskings
    is the top-K one among its distinct controls). Exact over every combination up to ``EXACT_LIMIT``, else
    Monte-Carlo as in ``permutation_p``.

    Returns: p in (0, 1]; NaN without a stratum that has marked and unmarked items.
    """
    weights = [1.0] * len(strata) if weights is None else weights
    kept = [(np.asarray(v, dtype=float), np.asarray(m, dtype=bool), w) for (v, m), w in zip(strata, weights)]
    kept = [(v, m, w) for v, m, w in kept if 0 < m.sum() < len(m)]
    if not kept:
        return math.nan
    strata, w = [(v, m) for v, m, _ in kept], np.array([w for *_, w in kept]) / sum(w for *_, w in kept)
    observed = sum(wi * (v[m].mean() - v.mean()) for wi, (v, m) in zip(w, strata))
    if math.prod(math.comb(len(v), int(m.sum())) for v, m in strata) <= EXACT_LIMIT:
        values, extra = np.zeros(1), 0
        for wi, (v, m) in zip(w, strata):  # every combination's statistic: the outer sum of the strata's terms
            terms = (np.array([v[list(c)].mean() for c in itertools.combinations(range(len(v)), int(m.sum()))])
                     - v.mean())
            values = np.add.outer(values, wi * terms).ravel()
    else:
        rng = np.random.default_rng(SEED)
        values, extra = np.zeros(PERMUTATIONS), 1
        for wi, (v, m) in zip(w, strata):
            marks = rng.permuted(np.tile(m, (PERMUTATIONS, 1)), axis=1)  # (draws, n)
            values += wi * ((marks * v).sum(axis=1) / m.sum() - v.mean())
    return two_sided(values, float(observed), extra)


def two_sided(values: np.ndarray, observed: float, extra: int) -> float:
    """Twice the smaller tail of the null ``values`` at ``observed``, capped at 1; ``extra`` 1 counts the observed
    arrangement among Monte-Carlo draws (0 for an exact enumeration, which holds it). Statistics equal up to
    rounding (computed in another order) count as equal."""
    tolerance = 1e-12 * max(1.0, abs(observed))
    above = (np.sum(values >= observed - tolerance) + extra) / (len(values) + extra)
    below = (np.sum(values <= observed + tolerance) + extra) / (len(values) + extra)
    return float(min(1.0, 2 * min(above, below)))


def min_p(n: int, m: int) -> float:
    """The smallest two-sided p a permutation test of two arms of n and m seeds can give."""
    return min(1.0, 2 / math.comb(n + m, n))


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment of p values for a family of tests (Holm 1979, "A simple sequentially
    rejective multiple test procedure", Scand. J. Statist. 6:65-70; scipy has Benjamini-Hochberg only): the
    i-th smallest of m p values is multiplied by (m - i + 1), made non-decreasing, capped at 1. Rejecting the
    adjusted p < alpha keeps the family-wise error rate at alpha. NaN entries are left out and stay NaN."""
    ps = [float(p) for p in ps]
    kept = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    out, running = [math.nan] * len(ps), 0.0
    for rank, (p, i) in enumerate(kept):
        running = max(running, min(1.0, (len(kept) - rank) * p))
        out[i] = running
    return out


@dataclass
class Comparison:
    """One test of a finding: the effect over seeds, its interval and p.

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
    claim: bool = True  # False: shown beside the claims (context), outside the Holm family, deciding nothing
    untestable: str = ""  # why the design keeps this claim from passing (e.g. too few distinct controls)
    ci_level: float = LEVEL  # of ``ci`` as computed (two one-sided tests at ALPHA: 1 - 2 ALPHA)

    @classmethod
    def of(cls, what: str, arms: list[np.ndarray], expected: int, unit: str = "") -> Comparison:
        """Mean of arm 0 minus mean of arm 1 over seeds, Welch's ``interval`` and the permutation p."""
        a, b = (np.asarray(x, dtype=float) for x in arms)
        return cls(what, float(a.mean() - b.mean()), interval(a, b), permutation_p([a, b]), expected,
                   (len(a), len(b)), unit)

    @classmethod
    def among(cls, what: str, arms: dict[str, np.ndarray], unit: str = "") -> Comparison:
        """Whether the arms (name -> seeds' values) differ at all, no direction expected: for two arms ``of``,
        the second minus the first (``what`` prefixed ``B - A:``); for more, the effect is the standard
        deviation of the arms' means (no interval: no pair is singled out) and p the permutation p of their
        ``spread``."""
        names, values = list(arms), [np.asarray(a, dtype=float) for a in arms.values()]
        if len(values) == 2:
            return cls.of(f"{names[1]} - {names[0]}: {what}", values[::-1], 0, unit)
        means = np.array([v.mean() for v in values])
        return cls(f"{what} (SD of the {len(values)} arm means)", float(means.std()), (math.nan, math.nan),
                   permutation_p(values, spread, upper=True), 0, tuple(len(v) for v in values), unit)

    @classmethod
    def paired(cls, what: str, differences: np.ndarray, p: float, expected: int, unit: str = "") -> Comparison:
        """Per-seed differences (one arm of seeds): their mean and its t interval, with ``p`` from a test
        made elsewhere (e.g. ``stratified_p``)."""
        d = np.asarray(differences, dtype=float)
        return cls(what, float(d.mean()), mean_ci(d), p, expected, (len(d),), unit)

    def verdict(self) -> tuple[str, str]:
        """(verdict, reason): ``reproduced`` with at least ``MIN_SEEDS`` seeds per arm, Holm-adjusted p <
        ``ALPHA`` in the expected direction (any direction where none is expected) and a 95% interval that
        excludes 0 (where there is one); ``refuted`` the same in the opposite direction; else ``inconclusive``
        with the reason; ``not testable`` where the design keeps it from passing (``by_design``). A context
        comparison (``claim`` false) is ``context``: it decides nothing."""
        if not self.claim:
            return "context", f"shown beside the claim, outside the Holm family (raw p {self.p:.3g})"
        if self.by_design():
            return BY_DESIGN, self.by_design() + "; outside the Holm family"
        if math.isnan(self.p_adj):
            return "inconclusive", "the effect is undefined on these runs"
        if self.p_adj < ALPHA and self.spans_zero():
            return "inconclusive", (f"adjusted p {self.p_adj:.3g} < {ALPHA} but the 95% interval spans 0 (seeds too "
                                    "spread for the permutation p's separation to fix the size of the effect)")
        if self.p_adj < ALPHA:
            return ("reproduced", "") if self.agrees() else ("refuted", "significant in the opposite direction")
        if self.spans_zero():
            return "inconclusive", "CI spans 0"
        floor = min_p(*self.seeds) if len(self.seeds) == 2 else 0.0
        return "inconclusive", (f"adjusted p {self.p_adj:.3g} >= {ALPHA}" + (
            f"; with {seeds_text(self.seeds)} seeds no p can fall below {floor:.2g}" if floor >= ALPHA else ""))

    def by_design(self) -> str:
        """Why the claim cannot pass whatever the data (``untestable``, or fewer than ``MIN_SEEDS`` seeds in an
        arm): such a claim is ``not testable`` and leaves its finding's Holm family; empty where it can."""
        if self.untestable:
            return self.untestable
        return f"too few seeds ({min(self.seeds)} in an arm; the rule needs {MIN_SEEDS})" if min(
            self.seeds) < MIN_SEEDS else ""

    def spans_zero(self) -> bool:
        """Whether the interval holds 0 (False where there is none); a CI of exactly 0 may come out as -3e-17."""
        return self.ci[0] <= 1e-12 and self.ci[1] >= -1e-12

    def agrees(self) -> bool:
        """Whether the effect has the expected sign (any sign where none is expected)."""
        return self.expected == 0 or np.sign(self.effect) == self.expected


Decided = tuple[Comparison, str, str]  # a comparison with its verdict and reason


@dataclass
class Test:
    """One test of a finding: its comparisons (none where the verdict is fixed) and its evidence in words.

    verdict, reason: a fixed verdict (``no signal``, ``not tested``, ``not testable at this budget``, ...)
    where nothing is compared. decide: a comparison's verdict where the test's rule is not
    ``Comparison.verdict``. combine: the test's verdict from its decided comparisons, (the comparison shown,
    verdict, reason), where it is not the default (findings._row).
    """

    finding: str
    test: str
    comparisons: list[Comparison] = field(default_factory=list)
    evidence: str = ""
    verdict: str = ""
    reason: str = ""
    decide: Callable[[Comparison], tuple[str, str]] | None = None
    combine: Callable[[list[Decided]], Decided] | None = None


def adjust(comparisons: list[Comparison]) -> None:
    """Sets each claim's ``p_adj``: Holm over the claims of the list (the tests of one finding) that can pass
    by design (``Comparison.by_design``); a context comparison, and a claim that cannot pass, keeps NaN."""
    claims = [c for c in comparisons if c.claim and not c.by_design()]
    for c, p in zip(claims, holm([c.p for c in claims])):
        c.p_adj = p


def tost(a: np.ndarray, b: np.ndarray, margin: float) -> tuple:
    """Two one-sided Welch t tests (Schuirmann 1987) that mean(a) - mean(b) lies within (-margin, margin), along
    the last axis (seeds; leading axes: many experiments at once): p (the larger one-sided p; < alpha:
    equivalent at level alpha) and the 1 - 2 alpha Welch interval (inside the margin exactly where p < alpha;
    the t distribution of ``scipy.stats.ttest_ind`` with ``equal_var=False``). Where neither arm's seeds vary:
    p 0 inside the margin, 1 outside, the interval the point; NaN with fewer than two seeds in an arm."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    d = a.mean(axis=-1) - b.mean(axis=-1)
    if min(a.shape[-1], b.shape[-1]) < 2:
        return np.full_like(d, math.nan)[()], (np.full_like(d, math.nan)[()],) * 2
    va, vb = a.var(axis=-1, ddof=1) / a.shape[-1], b.var(axis=-1, ddof=1) / b.shape[-1]
    se = np.sqrt(va + vb)
    with np.errstate(invalid="ignore", divide="ignore"):
        df = (va + vb) ** 2 / (va**2 / (a.shape[-1] - 1) + vb**2 / (b.shape[-1] - 1))
        p = np.maximum(st.t.sf((d + margin) / se, df), st.t.cdf((d - margin) / se, df))
        half = st.t.ppf(1 - ALPHA, df) * se
    point = se == 0
    p = np.where(point, np.where(np.abs(d) < margin, 0.0, 1.0), p)
    low, high = np.where(point, d, d - half), np.where(point, d, d + half)
    return p[()], (low[()], high[()])


def seeds_text(seeds: tuple[int, ...]) -> str:
    """Seeds per arm: ``5/5``, or for more than 3 arms ``3-5 (12 arms)``."""
    if len(seeds) <= 3:
        return "/".join(map(str, seeds))
    spread = str(min(seeds)) if min(seeds) == max(seeds) else f"{min(seeds)}-{max(seeds)}"
    return f"{spread} ({len(seeds)} arms)"


def strongest(decided: list[Decided]) -> Decided:
    """The comparison with the smallest adjusted p (then the smallest raw p, then the largest effect)."""
    return min(decided, key=lambda d: (nan_last(d[0].p_adj), nan_last(d[0].p), -abs(nan_last(d[0].effect))))


def nan_last(p: float) -> float:
    return math.inf if math.isnan(p) else p
