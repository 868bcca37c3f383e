"""Censored times for the findings' verdicts (analysis/emergence.py, analysis/laziness.py): the log-rank test
with its exact permutation p, and the Kaplan-Meier median. A time is right-censored where the event has not
happened by the run's last observation; it is never dropped and never counted as an event."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as st

from hybrid_lightning.analysis.permutation import permutation_test


def censored(times: np.ndarray, events: np.ndarray) -> st.CensoredData:
    """Event times (``events`` true) and right-censoring times (false) as scipy's ``CensoredData``."""
    times, events = np.asarray(times, dtype=float), np.asarray(events, dtype=bool)
    return st.CensoredData(uncensored=times[events], right=times[~events])


def logrank_z(times: np.ndarray, events: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The log-rank z of ``scipy.stats.logrank`` (> 0: the first arm has its events earlier than expected)
    for many arrangements at once: ``first`` (A, N) bool marks the runs of the first arm in each arrangement
    of the N runs' (``times``, ``events``). (O - E) / sqrt(V) summed over the distinct event times; 0 where V
    is 0 (no event at which both arms were at risk). The runs sorted by time, the first arm's runs at risk and
    its events at each event time are cumulative sums: O(A N)."""
    order = np.argsort(np.asarray(times, dtype=float), kind="stable")
    t, e = np.asarray(times, dtype=float)[order], np.asarray(events, dtype=bool)[order]
    at = np.unique(t[e])  # (J,) the distinct event times
    low, high = np.searchsorted(t, at, "left"), np.searchsorted(t, at, "right")  # runs [low, high) end at each
    ended = np.r_[0, np.cumsum(e)]
    n, d = (len(t) - low).astype(float)[:, None], (ended[high] - ended[low]).astype(float)[:, None]  # (J, 1)
    g = np.asarray(first, dtype=float).T[order]  # (N, A): runs sorted by time, down the rows
    n1 = np.cumsum(g[::-1], axis=0)[::-1][low]  # (J, A): first-arm runs with time >= each event time
    died = np.cumsum(np.vstack([np.zeros((1, g.shape[1])), g * e[:, None]]), axis=0)  # (N + 1, A)
    d1 = died[high] - died[low]
    observed_minus_expected = (d1 - n1 * d / n).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(n > 1, n1 * (n - n1) * d * (n - d) / (n**2 * (n - 1)), 0.0).sum(axis=0)
        return np.where(v > 0, observed_minus_expected / np.sqrt(np.where(v > 0, v, 1.0)), 0.0)


def logrank_statistic(x: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``logrank_z`` as a statistic of ``permutation.permutation_test``: x (..., 2, N) each run's (time,
    event), codes (B, N) -> (..., B), arm 0 the first."""
    out = np.empty(x.shape[:-2] + (len(codes),))
    for i in np.ndindex(x.shape[:-2]):  # the experiments one by one: their event times differ
        out[i] = logrank_z(x[i][0], x[i][1].astype(bool), codes == 0)
    return out


def logrank(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[float, float]:
    """(z, p) of the log-rank test of two arms of censored times, each (times, events): z as
    ``scipy.stats.logrank`` gives it (> 0: arm ``a`` has its events earlier), p two-sided from the
    permutation distribution of z over relabellings of the runs between the arms
    (``permutation.permutation_test``, exact up to ``EXACT_LIMIT``): the asymptotic p rejects 6-7% of true
    nulls at 3 and 5 seeds per arm. NaN where neither arm has an event."""
    if not (np.asarray(a[1], dtype=bool).any() or np.asarray(b[1], dtype=bool).any()):
        return math.nan, math.nan
    z, p = permutation_test([np.array(a, dtype=float), np.array(b, dtype=float)], logrank_statistic)
    return float(z), float(p)


def km_median(times: np.ndarray, events: np.ndarray) -> float:
    """The Kaplan-Meier median (``scipy.stats.ecdf``): the first time the share without the event falls to
    0.5 or below; NaN where it stays above (too few events by the runs' last observations)."""
    if not np.asarray(events, dtype=bool).any():
        return math.nan
    sf = st.ecdf(censored(times, events)).sf
    at = sf.quantiles[sf.probabilities <= 0.5]
    return float(at[0]) if len(at) else math.nan
