"""Censored times for the findings' verdicts (analysis/emergence.py, analysis/laziness.py): the log-rank test
with its exact permutation p, and the Kaplan-Meier median. A time is right-censored where the event has not
happened by the run's last observation; it is never dropped and never counted as an event."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as st

from hybrid_lightning.analysis.permutation import permutation_test

GROUP = 50_000  # experiments x relabellings whose log-rank sums are held in memory at once (x event times)


def censored(times: np.ndarray, events: np.ndarray) -> st.CensoredData:
    """Event times (``events`` true) and right-censoring times (false) as scipy's ``CensoredData``."""
    times, events = np.asarray(times, dtype=float), np.asarray(events, dtype=bool)
    return st.CensoredData(uncensored=times[events], right=times[~events])


def logrank_z(times: np.ndarray, events: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The log-rank z of ``scipy.stats.logrank`` (> 0: the first arm has its events earlier than expected)
    for many arrangements at once: ``first`` (A, N) bool marks the runs of the first arm in each arrangement
    of the N runs' (``times``, ``events``). (O - E) / sqrt(V) summed over the distinct event times; 0 where V
    is 0 (no event at which both arms were at risk)."""
    return _z(np.asarray(times, dtype=float)[None], np.asarray(events, dtype=bool)[None], np.asarray(first))[0]


def _z(t: np.ndarray, e: np.ndarray, first: np.ndarray) -> np.ndarray:
    """``logrank_z`` of R experiments at once: t, e (R, N), first (A, N) -> (R, A). Each experiment's
    distinct event times (R, J), padded with inf where it has fewer; the first arm's runs at risk and events
    at each are one matrix product over the runs."""
    ends = np.sort(np.where(e, t, np.inf), axis=1)
    ends[:, 1:][ends[:, 1:] == ends[:, :-1]] = np.inf  # each distinct event time once
    at = np.sort(ends, axis=1)[:, :max(1, int(np.isfinite(ends).sum(axis=1).max()))]  # (R, J)
    risk = (t[:, :, None] >= at[:, None, :]).astype(float)  # (R, N, J)
    n = risk.sum(axis=1)  # (R, J) at risk, and ended with an event, at each event time
    d = (e[:, :, None] & (t[:, :, None] == at[:, None, :])).sum(axis=1).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = np.where(n > 0, d / n, 0.0)  # O - E = the first arm's events - sum_j n1 d / n
        c = np.where(n > 1, d * (n - d) / (n**2 * (n - 1)), 0.0)  # V = sum_j n1 (n - n1) c
    g = first.astype(float)  # (A, N)
    n1 = np.einsum("an,rnj->raj", g, risk, optimize=True)  # (R, A, J) first-arm runs at risk
    observed_minus_expected = (e.astype(float) @ g.T) - np.einsum("raj,rj->ra", n1, expected)
    v = np.einsum("raj,rj->ra", n1, n * c) - np.einsum("raj,rj->ra", n1**2, c)
    v = np.where(v > 1e-12 * np.einsum("raj,rj->ra", n1, n * c), v, 0.0)  # 0 up to rounding: no comparison
    return np.where(v > 0, observed_minus_expected / np.sqrt(np.where(v > 0, v, 1.0)), 0.0)


def logrank_statistic(x: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``logrank_z`` as a statistic of ``permutation.permutation_test``: x (..., 2, N) each run's (time,
    event), codes (B, N) -> (..., B), arm 0 the first; the experiments in groups of at most ``GROUP``
    experiment-relabelling pairs."""
    t, e = x[..., 0, :].reshape(-1, x.shape[-1]), x[..., 1, :].reshape(-1, x.shape[-1]).astype(bool)
    step = max(1, GROUP // len(codes))
    z = np.concatenate([_z(t[i:i + step], e[i:i + step], codes == 0) for i in range(0, len(t), step)])
    return z.reshape(x.shape[:-2] + (len(codes),))


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
