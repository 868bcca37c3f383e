"""Scaling laws as the paper fits them (finding 1 of "Rethinking the Role of Efficient Attention in Hybrid
Architectures", arXiv 2606.15378; its authors' ``src/scaling/fit_scaling.py``, github.com/thunlp/
rethinking-hybrid-attention), written here from their description:

    log L = logsumexp(B - alpha log N, C - beta log D)         ``no_constant``, the paper's form
    log L = logsumexp(A, B - alpha log N, C - beta log D)      ``constant``: L = e^A + e^B N^-alpha + e^C D^-beta

N: non-embedding parameters; D: training tokens; L: the quantity fitted, a loss: the held-out text loss
(nats per token), or for LongPPL (``longppl``) its log, the mean loss over the key tokens (the authors take the
log of LongPPL first and then fit the log of that). The parameters minimise the sum over cells of the Huber
loss (delta ``HUBER_DELTA``) of the log residuals, ``log L_fit - log L``, by L-BFGS-B (``scipy.optimize.minimize``)
from every point of a grid of starts, the best of which is polished once more; the largest size is held out
and predicted. Intervals (``bootstrap``) and the budget at which two laws come within a margin
(``convergence_budget``) are what the paper does not give.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import brentq, minimize
from scipy.special import huber, logsumexp
from threadpoolctl import threadpool_limits

HUBER_DELTA = 1e-3  # the paper's
FORMS = {"no_constant": ("B", "C", "alpha", "beta"), "constant": ("A", "B", "C", "alpha", "beta")}
# Starts, per parameter: every combination is one L-BFGS-B run (4 x 4 x 3 x 4 = 192 for the paper's form; the
# authors' script runs 1,728; on their table the best start of both grids lies in one basin).
STARTS = {"A": (-1.0, 0.0, 1.0), "B": (0.0, 4.0, 8.0, 12.0), "C": (0.0, 4.0, 8.0, 12.0),
          "alpha": (0.1, 0.3, 1.0), "beta": (0.1, 0.3, 0.6, 1.0)}
EXPONENT_BOUNDS = (0.0, None)  # alpha and beta; A, B and C are free
# scipy's ftol is relative to max(|loss|, 1), so for summed Huber losses of ~1e-4 it is absolute. The authors
# run each start at 1e-6 and polish at 1e-8, which on their table stops about 3% above the minimum (docs/scaling.md);
# the polish here goes on to the minimum unless told ``AUTHORS_FTOL``.
START_FTOL, AUTHORS_FTOL, FTOL = 1e-6, 1e-8, 1e-13
COLUMNS = ("size", "n", "tokens", "value")  # a scaling table; ``seed`` optional (several rows per cell)
RELEASED = ("model_size", "token_multiplier", "n", "loss")  # the columns of the authors' released tables
RESAMPLES, SEED, LEVEL = 200, 0, 0.95  # a refit takes ~0.3 s of CPU (the polish to the minimum)
K_RANGE = (1.0, 1e5)  # tokens per parameter searched for a convergence budget


@dataclass(frozen=True)
class Law:
    """A fitted law: ``form`` (``FORMS``), ``params`` by name, ``objective`` (the summed Huber loss at them)."""

    form: str
    params: dict[str, float]
    objective: float = math.nan

    def log_value(self, n, tokens) -> np.ndarray:
        """log L at N = ``n`` and D = ``tokens`` (broadcast)."""
        theta = np.array([self.params[k] for k in FORMS[self.form]])
        return logsumexp(_terms(theta, np.log(np.asarray(n, float)), np.log(np.asarray(tokens, float))), axis=0)

    def value(self, n, tokens) -> np.ndarray:
        """L at N = ``n`` and D = ``tokens``."""
        return np.exp(self.log_value(n, tokens))


def _terms(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    """The exponents summed under the logsumexp, (terms, *cells): [A,] B - alpha log N, C - beta log D."""
    *a, b, c, alpha, beta = theta
    log_n, log_d = np.broadcast_arrays(log_n, log_d)
    rows = [b - alpha * log_n, c - beta * log_d]
    return np.stack([np.full_like(log_n, a[0]), *rows] if a else rows)


def _objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_y: np.ndarray,
               delta: float) -> tuple[float, np.ndarray]:
    """The summed Huber loss of the log residuals and its gradient in ``theta``."""
    terms = _terms(theta, log_n, log_d)  # (terms, cells)
    log_fit = logsumexp(terms, axis=0)
    weights = np.exp(terms - log_fit)  # d log_fit / d term, (terms, cells)
    slope = np.clip(log_fit - log_y, -delta, delta)  # d huber / d residual, (cells,)
    per_term = weights @ slope  # d loss / d term's constant
    grad = [*per_term, -(weights[-2] * slope) @ log_n, -(weights[-1] * slope) @ log_d]
    return float(huber(delta, log_fit - log_y).sum()), np.array(grad)


def fit_law(n, tokens, y, form: str = "no_constant", bounds: dict | None = None, starts: dict | None = None,
            delta: float = HUBER_DELTA, ftol: float = FTOL) -> Law:
    """The law of ``form`` fitted to the cells (N ``n``, D ``tokens``, the quantity ``y`` > 0): L-BFGS-B from
    every start of the grid at the authors' ``START_FTOL``, the best one polished at ``ftol``.

    Args:
        bounds: per parameter (lower, upper), None for unbounded; default ``EXPONENT_BOUNDS`` on alpha and beta.
        starts: per parameter the values of the grid of starts (default ``STARTS``); a start outside the bounds
            is moved onto them.
        delta: the Huber loss's delta.
        ftol: the polish's tolerance (scipy's, relative to max(|loss|, 1): absolute for these losses of ~1e-4);
            ``AUTHORS_FTOL`` stops where the authors' script stops.
    """
    names = _form(form)
    y = np.asarray(y, float)
    if (y <= 0).any() or not np.isfinite(y).all():
        raise ValueError("the fitted quantity must be positive and finite in every cell (its log is fitted)")
    data = (np.log(np.asarray(n, float)), np.log(np.asarray(tokens, float)), np.log(y), delta)
    box = [({"alpha": EXPONENT_BOUNDS, "beta": EXPONENT_BOUNDS} | (bounds or {})).get(k, (None, None)) for k in names]
    lower, upper = ([-np.inf if lo is None else lo for lo, _ in box], [np.inf if hi is None else hi for _, hi in box])
    grid = {**STARTS, **(starts or {})}
    best = None
    with threadpool_limits(1):  # BLAS threads only contend on problems this small
        for x0 in itertools.product(*(np.atleast_1d(grid[k]) for k in names)):
            r = _minimize(np.clip(x0, lower, upper), data, box, START_FTOL)
            if np.isfinite(r.fun) and (best is None or r.fun < best.fun):
                best = r
        polished = _minimize(best.x, data, box, ftol)
    r = polished if polished.fun <= best.fun else best
    return Law(form, dict(zip(names, map(float, r.x))), float(r.fun))


def _minimize(x0: np.ndarray, data: tuple, box: list, ftol: float):
    """One L-BFGS-B run of ``_objective`` with its gradient."""
    return minimize(_objective, x0, args=data, jac=True, method="L-BFGS-B", bounds=box,
                    options={"maxiter": 20000, "ftol": ftol, "gtol": 1e-12})


def _form(form: str) -> tuple[str, ...]:
    if form not in FORMS:
        raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
    return FORMS[form]


def read_table(path: str | Path) -> pd.DataFrame:
    """A released table (TSV or CSV with the columns ``RELEASED``: ``token_multiplier`` is the training tokens
    per parameter, e.g. ``200.110938n``) as a scaling table: size, n, tokens (= multiplier x n), value (the
    ``loss`` column as written: a loss, or LongPPL)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"TABLE: {path} is not a file")
    raw = pd.read_csv(path, sep=None, engine="python", dtype={"model_size": str, "token_multiplier": str})
    missing = [c for c in RELEASED if c not in raw.columns]
    if missing:
        raise ValueError(f"TABLE: {path} lacks the column(s) {missing}; it needs {list(RELEASED)}")
    multiplier = raw["token_multiplier"].map(_multiplier)
    return pd.DataFrame({"size": raw["model_size"], "n": raw["n"].astype(float),
                         "tokens": multiplier * raw["n"].astype(float), "value": raw["loss"].astype(float)})


def _multiplier(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*[nN]?\s*", str(text))
    if not match:
        raise ValueError(f"token_multiplier: {text!r} is not tokens per parameter such as '200.1n'")
    return float(match.group(1))


@dataclass(frozen=True)
class ScalingFit:
    """A law fitted to a scaling table: ``law``, ``longppl`` (the table's values are LongPPL, the law fits
    their log), ``fitted`` (the cells fitted, with ``quantity``, the value the law fits), ``held_out`` (the
    cells predicted: size, n, tokens, actual, predicted, error = predicted - actual, relative_error = error /
    actual; with ``longppl`` also actual_ppl, predicted_ppl, ppl_error), ``settings`` (bounds, delta, ftol: what
    a refit of a resample uses)."""

    law: Law
    longppl: bool
    fitted: pd.DataFrame
    held_out: pd.DataFrame
    settings: dict = field(default_factory=dict)


def quantity(table: pd.DataFrame, longppl: bool) -> pd.Series:
    """The quantity a law fits: the value, or with ``longppl`` its log (log LongPPL, nats per key token)."""
    values = table["value"].astype(float)
    if longppl and (values <= 1).any():
        raise ValueError("--longppl: LongPPL must be above 1 in every cell (the law fits the log of its log)")
    return np.log(values) if longppl else values


def largest(table: pd.DataFrame) -> pd.Series:
    """The cells of the largest N: those a fit with ``hold_out`` ``largest`` predicts instead of fitting."""
    return table["n"] == table["n"].max()


def fit_table(table: pd.DataFrame, form: str = "no_constant", longppl: bool = False, hold_out: str | None = "largest",
              bounds: dict | None = None, starts: dict | None = None, delta: float = HUBER_DELTA,
              ftol: float = FTOL) -> ScalingFit:
    """The law of ``form`` fitted to a scaling table (``COLUMNS``), the cells of the largest N held out and
    predicted (``hold_out`` ``largest``; None fits every cell)."""
    if hold_out not in ("largest", None):
        raise ValueError(f"hold_out must be 'largest' or None, got {hold_out!r}")
    table = table.assign(quantity=quantity(table, longppl))
    held = largest(table) if hold_out else pd.Series(False, index=table.index)
    fitted = table[~held]
    if fitted["n"].nunique() < 2 or fitted["tokens"].nunique() < 2:
        raise ValueError(f"a scaling fit needs two sizes and two budgets or more among the cells it fits, got "
                         f"{fitted['n'].nunique()} size(s) and {fitted['tokens'].nunique()} budget(s)"
                         + (" (the largest size is held out)" if hold_out else ""))
    law = fit_law(fitted["n"], fitted["tokens"], fitted["quantity"], form, bounds, starts, delta, ftol)
    return ScalingFit(law, longppl, fitted.reset_index(drop=True), predictions(law, table[held], longppl),
                      {"bounds": bounds or {}, "delta": delta, "ftol": ftol})


def predictions(law: Law, cells: pd.DataFrame, longppl: bool) -> pd.DataFrame:
    """Measured against predicted for ``cells`` (with ``quantity``); see ``ScalingFit.held_out``."""
    actual = cells["quantity"].to_numpy(float)
    predicted = law.value(cells["n"].to_numpy(float), cells["tokens"].to_numpy(float))
    out = pd.DataFrame({"size": cells["size"].to_numpy(), "n": cells["n"].to_numpy(float),
                        "tokens": cells["tokens"].to_numpy(float), "actual": actual, "predicted": predicted,
                        "error": predicted - actual, "relative_error": (predicted - actual) / actual})
    if longppl:
        out = out.assign(actual_ppl=np.exp(actual), predicted_ppl=np.exp(predicted),
                         ppl_error=np.exp(predicted) - np.exp(actual))
    return out


def parameters(fit: ScalingFit) -> pd.DataFrame:
    """The law's parameters: parameter, value, and for B and C (A) also the coefficients e^B, e^C (e^A) that the
    authors' script prints (``b``, ``c``, ``a``)."""
    rows = [{"parameter": k, "value": v} for k, v in fit.law.params.items()]
    rows += [{"parameter": k.lower(), "value": math.exp(v)} for k, v in fit.law.params.items() if k in "ABC"]
    return pd.DataFrame(rows)


def bootstrap(fit: ScalingFit, resamples: int = RESAMPLES, seed: int = SEED) -> list[Law]:
    """Refits of ``resamples`` resamples of the fitted cells, each warm-started at the fit and polished at its
    tolerance. Where every cell (size, budget) has two seeds or more, each cell's seeds are resampled; else log
    residuals are resampled over the cells and added to the fitted log values: the fit's, less the p smallest in
    size (p parameters), centred. A Huber loss whose delta is below the noise (the paper's 1e-3 against log
    residuals of ~1e-2) fits almost as least absolute deviations, which pass through about p cells: their
    residuals are near 0 and say nothing of the error (docs/scaling.md: with them, the intervals covered the true
    exponents in 91 and 89 of 100 replications; without them 94 and 91)."""
    rng = np.random.default_rng(seed)
    cells = fit.fitted
    log_y = np.log(cells["quantity"].to_numpy(float))
    log_fit = fit.law.log_value(cells["n"].to_numpy(float), cells["tokens"].to_numpy(float))
    groups = cells.groupby(["n", "tokens"], sort=False).indices
    by_seed = min(len(i) for i in groups.values()) >= 2
    residuals = log_y - log_fit
    residuals = residuals[np.argsort(np.abs(residuals))[min(len(fit.law.params), len(residuals) - 1):]]  # (cells - p,)
    residuals = residuals - residuals.mean()
    laws = []
    for _ in range(resamples):
        if by_seed:
            rows = np.concatenate([rng.choice(i, len(i)) for i in groups.values()])
            n, tokens, y = (cells[c].to_numpy(float)[rows] for c in ("n", "tokens", "quantity"))
        else:
            n, tokens = cells["n"].to_numpy(float), cells["tokens"].to_numpy(float)
            y = np.exp(log_fit + rng.choice(residuals, len(log_fit)))
        laws.append(fit_law(n, tokens, y, fit.law.form, fit.settings["bounds"], {k: (v,) for k, v in
                            fit.law.params.items()}, fit.settings["delta"], fit.settings["ftol"]))
    return laws


def intervals(fit: ScalingFit, draws: list[Law], level: float = LEVEL) -> pd.DataFrame:
    """Each parameter of the fit with the ``level`` percentile interval of its bootstrap ``draws``: parameter,
    value, ci_low, ci_high, resamples."""
    tail = (1 - level) / 2
    rows = []
    for k, v in fit.law.params.items():
        values = np.array([d.params[k] for d in draws])
        rows.append({"parameter": k, "value": v, "ci_low": float(np.quantile(values, tail)),
                     "ci_high": float(np.quantile(values, 1 - tail)), "resamples": len(values)})
    return pd.DataFrame(rows)


def gap(a: Law, b: Law, n: float, k) -> np.ndarray:
    """The fitted quantity of ``a`` minus that of ``b`` at N = ``n`` and D = ``k`` N (for LongPPL fits, the log of
    the ratio of their LongPPLs)."""
    k = np.asarray(k, float)
    return a.value(n, k * n) - b.value(n, k * n)


def convergence_budget(a: Law, b: Law, n: float, margin: float, k_range: tuple[float, float] = K_RANGE) -> float:
    """The tokens per parameter from which the two laws stay within ``margin`` of each other (|``gap``| <=
    margin) at N = ``n``, up to ``k_range[1]``: ``k_range[0]`` where they are within it from the start, inf where
    they are still apart at ``k_range[1]``."""
    grid = np.geomspace(*k_range, 400)
    outside = np.abs(gap(a, b, n, grid)) > margin
    if not outside.any():
        return float(k_range[0])
    last = int(np.flatnonzero(outside)[-1])
    if last == len(grid) - 1:
        return math.inf
    within = lambda log_k: abs(float(gap(a, b, n, math.exp(log_k)))) - margin  # noqa: E731
    return float(math.exp(brentq(within, math.log(grid[last]), math.log(grid[last + 1]))))


def convergence(a: Law, b: Law, draws_a: list[Law], draws_b: list[Law], n: float, margin: float,
                level: float = LEVEL) -> dict:
    """``convergence_budget`` of two fits and its ``level`` percentile interval over their bootstrap draws (draw i
    of one with draw i of the other: the arms are resampled apart); an end is inf where that share of the draws
    never comes within the margin. Returns: budget, ci_low, ci_high, n, margin."""
    budgets = np.array([convergence_budget(x, y, n, margin) for x, y in zip(draws_a, draws_b)])
    tail = (1 - level) / 2
    low, high = (float(np.quantile(budgets, q, method="inverted_cdf")) for q in (tail, 1 - tail))
    return {"budget": convergence_budget(a, b, n, margin), "ci_low": low, "ci_high": high, "n": n, "margin": margin}
