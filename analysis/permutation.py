"""The permutation test of the findings' verdicts (analysis/stats.py, analysis/survival.py) and of the design
check's power simulations (analysis/power.py): one implementation, so that the planner's p on a simulated
experiment is the p the verdict would give on the same runs.

It is ``scipy.stats.permutation_test`` (``permutation_type="independent"``) as scipy computes it, vectorised
over the relabellings and over many experiments at once, and allowing an arm of one seed (scipy refuses one;
the log-rank comparison of a window with one run keeps its p): every distinct assignment of the runs to arms
of their sizes where there are at most ``EXACT_LIMIT``, else ``PERMUTATIONS`` permutations drawn as scipy draws
them (``rng.permutation(N)`` each, from ``np.random.default_rng(SEED)``) and counted with the observed one,
(1 + hits) / (1 + draws) (Phipson & Smyth 2010, https://arxiv.org/abs/1603.05766); values within scipy's
tolerance (100 machine epsilons of the observed value) count as equal. tests/test_registry.py checks that it
gives scipy's p, exact and Monte Carlo.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

import numpy as np

SEED = 0  # of every random draw of the analysis, so that reports are reproducible
PERMUTATIONS = 20_000  # Monte-Carlo relabellings where the exact enumeration would be longer than EXACT_LIMIT
EXACT_LIMIT = 50_000
CHUNK = 5_000  # relabellings whose statistics are held in memory at once

# statistic(x, codes): x (..., N) the runs' values in their observed order (leading axes: many experiments at
# once; a statistic of a row per run, e.g. a censored time, takes (..., row, N)); codes (B, N) the arm each of
# B relabellings gives each run -> (..., B)
Statistic = Callable[[np.ndarray, np.ndarray], np.ndarray]


def arm_means(x: np.ndarray, codes: np.ndarray) -> list[np.ndarray]:
    """Per arm g, (..., B): the mean of x (..., N) over the runs relabelling b puts in arm g."""
    masks = [(codes == g).astype(float) for g in range(int(codes[0].max()) + 1)]  # each (B, N)
    return [x @ m.T / m[0].sum() for m in masks]


def mean_difference(x: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Mean of arm 0 minus mean of arm 1: (..., N) -> (..., B)."""
    first, second = arm_means(x, codes)[:2]
    return first - second


def spread(x: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Between-arm sum of squares of the arms' means (the one-way ANOVA numerator): (..., N) -> (..., B); large
    for any difference among the arms."""
    grand = x.mean(axis=-1, keepdims=True)
    sizes = np.bincount(codes[0])
    return sum(n * (m - grand) ** 2 for n, m in zip(sizes, arm_means(x, codes)))


def relabellings(sizes: tuple[int, ...]) -> tuple[np.ndarray, bool]:
    """(codes (B, N), exact): the arm each relabelling gives each of the runs (arms of ``sizes``, in order):
    every distinct one where there are at most ``EXACT_LIMIT``, else ``PERMUTATIONS`` random ones."""
    return _relabellings(tuple(sizes), EXACT_LIMIT, PERMUTATIONS)


@functools.lru_cache(maxsize=32)
def _relabellings(sizes: tuple[int, ...], limit: int, draws: int) -> tuple[np.ndarray, bool]:
    base = np.repeat(np.arange(len(sizes)), sizes)
    if count(sizes) <= limit:
        codes, exact = np.full((1, len(base)), -1), True
        for g, n in enumerate(sizes):  # place each arm in turn: every choice of its runs among those still free
            free = np.nonzero(codes < 0)[1].reshape(len(codes), -1)  # (R, F), the same F in every row
            choices = np.array(list(itertools.combinations(range(free.shape[1]), n)), dtype=int).reshape(-1, n)  # (C,n)
            chosen = free[:, choices].reshape(-1, n)  # (R * C, n)
            codes = np.repeat(codes, len(choices), axis=0)
            codes[np.arange(len(codes))[:, None], chosen] = g
    else:
        rng = np.random.default_rng(SEED)
        order = np.array([rng.permutation(len(base)) for _ in range(draws)])  # scipy's draws, one by one
        codes, exact = np.empty_like(order), False
        np.put_along_axis(codes, order, base[None], axis=1)  # run order[b, k] takes the arm of position k
    codes.setflags(write=False)
    return codes, exact


def count(sizes) -> int:
    """Distinct assignments of sum(sizes) runs to arms of these sizes (a multinomial coefficient)."""
    return math.factorial(sum(sizes)) // math.prod(math.factorial(s) for s in sizes)


def permutation_test(arms: list[np.ndarray], statistic: Statistic = mean_difference,
                     upper: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(observed statistic, p) under the null that the arms are exchangeable: two-sided (twice the smaller
    tail, capped at 1), or with ``upper`` the share at or above the observed value (for a statistic large for
    any difference, e.g. ``spread``). Each arm is (..., n_i) (or (..., row, n_i)): the leading axes are
    experiments tested at once with the same relabellings, each getting the p it would get alone. NaN where
    the observed statistic is."""
    x = np.concatenate([np.asarray(a, dtype=float) for a in arms], axis=-1)
    sizes = tuple(np.shape(a)[-1] for a in arms)
    observed = statistic(x, np.repeat(np.arange(len(sizes)), sizes)[None])[..., 0]
    codes, exact = relabellings(sizes)
    tolerance = np.abs(100 * np.finfo(float).eps * observed)[..., None]
    above, below = np.zeros(observed.shape), np.zeros(observed.shape)
    for start in range(0, len(codes), CHUNK):
        null = statistic(x, codes[start:start + CHUNK])  # (..., chunk)
        above += (null >= observed[..., None] - tolerance).sum(axis=-1)
        below += (null <= observed[..., None] + tolerance).sum(axis=-1)
    extra = 0 if exact else 1
    above, below = (above + extra) / (len(codes) + extra), (below + extra) / (len(codes) + extra)
    p = above if upper else np.minimum(1.0, 2 * np.minimum(above, below))
    return observed, np.where(np.isnan(observed), np.nan, p)


def permutation_p(arms: list[np.ndarray], statistic: Statistic = mean_difference, upper: bool = False):
    """The p of ``permutation_test``: a float for arms of one experiment, else an array over the leading axes."""
    p = permutation_test(arms, statistic, upper)[1]
    return float(p) if p.ndim == 0 else p
