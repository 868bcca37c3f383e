"""Scaling laws of a grid of runs with a size and a budget axis (analysis/scaling.py), and the verdict they give
finding 1 (registered in analysis/registry.py).

An *arm* of a fit is the runs alike but for their size and budget: the architecture's identity
(``Runs.configs["arch"]``) without ``SCALE_KEYS``. Each finished run is one cell: N its recorded non-embedding
parameters, D its budget (``train.max_steps`` x tokens per step, from its plan), the value its last ``metric``
(``METRICS``: LongPPL, whose log is fitted as the authors fit it, and the held-out text loss). An arm is fitted
where it has ``MIN_SIZES`` sizes (the largest held out) and two budgets or more.

The verdict (*scaling*): for each pair of fitted arms, the gap of their fitted log LongPPL at the largest size
and the smallest budget of the grid (the arms differ early: its 95% bootstrap interval excludes 0 and its
bootstrap p, twice the smaller share of draws on one side of 0 plus 1 / resamples, is below 0.05 after Holm's
adjustment over the finding) and the
budget from which they stay within ``MARGIN`` (``scaling.convergence``). ``reproduced``: a gap early and a
convergence budget whose interval ends within ``scaling.K_RANGE``; ``refuted``: apart beyond the margin up to
the end of that range in 97.5% of the draws; else inconclusive. ``not applicable`` where no arm has a size and a
budget axis.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import scaling
from hybrid_lightning.analysis.arms import _shared
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.stats import Comparison, Test
from hybrid_lightning.analysis.tables import final_values
from hybrid_lightning.analysis.verdict import Design, Models, Planned, Verdict, complete
from hybrid_lightning.records import Tag

SIZE_KEYS = ("model.n_layers", "model.d_model", "model.n_heads", "model.n_kv_heads", "model.mlp_hidden",
             "model.efficient_mlp_hidden")
BUDGET_KEYS = ("train.max_steps", "train.tokens_per_param", "train.warmup_steps")
SCALE_KEYS = SIZE_KEYS + BUDGET_KEYS
METRICS = {"longppl": (Tag.LONGPPL, True), "text_loss": (Tag.TEXT_LOSS, False)}  # name -> (tag, fit its log)
MIN_SIZES = 3
MARGIN = 0.05  # log LongPPL (nats per key token): LongPPLs within about 5% of each other
F = "1. emergence speed"
NOT_APPLICABLE = "not applicable"


def arm_cells(configs: pd.DataFrame) -> pd.DataFrame:
    """One row per run of ``configs`` (``Runs.configs``, or a grid's planned ones) with a recorded non-embedding
    parameter count: arm (its architecture without ``SCALE_KEYS``), run, seed, size, n, tokens."""
    c = configs[pd.to_numeric(configs["non_embedding_params"], errors="coerce").notna()]
    if c.empty:
        return pd.DataFrame(columns=["arm", "run", "seed", "size", "n", "tokens"])
    rest = c["arch"].map(lambda a: json.dumps({k: v for k, v in json.loads(a).items() if k not in SCALE_KEYS},
                                              sort_keys=True))
    names = arm_names({r: tuple(g) for r, g in c.groupby(rest)["label"]})
    n = c["non_embedding_params"].astype(float)
    return pd.DataFrame({"arm": rest.map(names), "run": c["run"], "seed": c.get("seed"),
                         "size": n.map(lambda x: f"{x:.4g}"), "n": n,
                         "tokens": c["train.max_steps"].astype(float) * c["tokens_per_step"].astype(float)
                         }).reset_index(drop=True)


def arm_names(labels: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """Architecture -> its name: the words its runs' labels share, without the cut word that ends a label too long
    (``n_h…``), unless that would give two architectures one name."""
    full = {arch: _shared(of) for arch, of in labels.items()}
    short = {arch: " ".join(w for w in name.split() if not w.endswith("…")) or name for arch, name in full.items()}
    return short if len(set(short.values())) == len(short) else full


def cells(runs: Runs, tag: str) -> pd.DataFrame:
    """One row per finished run that logged ``tag``: arm, run, seed, size, n, tokens, value (its last value)."""
    c = runs.configs
    last = final_values(runs.metrics, tag).set_index("run")["value"]
    table = arm_cells(c[(c["state"] == "done") & c["run"].isin(last.index)])
    return table.assign(value=table["run"].map(last).astype(float))


def scalable(table: pd.DataFrame) -> bool:
    """Whether an arm's cells have a size and a budget axis: ``MIN_SIZES`` sizes, and two budgets or more among the
    cells fitted (the largest size held out), in tokens and in tokens per parameter alike: one step budget over
    several sizes, or one tokens-per-parameter budget, is no budget axis."""
    fitted = table[~scaling.largest(table)]
    return (table["n"].nunique() >= MIN_SIZES and fitted["tokens"].nunique() >= 2
            and (fitted["tokens"] / fitted["n"]).round(6).nunique() >= 2)


def fit_arms(runs: Runs, metric: str, form: str = "no_constant", resamples: int | None = None,
             **options) -> dict[str, tuple[scaling.ScalingFit, list[scaling.Law]]]:
    """Per arm with a size and a budget axis, its fit of ``metric`` (``METRICS``; the largest size held out) and
    its bootstrap draws (``resamples``, default ``scaling.RESAMPLES``); ``options`` go to ``scaling.fit_table``."""
    tag, longppl = METRICS[metric]
    out = {}
    for arm, table in cells(runs, tag).groupby("arm", sort=True):
        if scalable(table):
            fit = scaling.fit_table(table, form, longppl, "largest", **options)
            out[arm] = (fit, scaling.bootstrap(fit, scaling.RESAMPLES if resamples is None else resamples))
    return out


def scaling_tests(runs: Runs) -> list[Test]:
    """The *scaling* test per pair of arms fitted on LongPPL; ``not applicable`` without such a grid."""
    table = cells(runs, METRICS["longppl"][0])
    if not any(scalable(t) for _, t in table.groupby("arm")):
        return [Test(F, SCALING.name, verdict=NOT_APPLICABLE,
                     reason="no architecture has finished runs of LongPPL at 3+ sizes and 2+ budgets",
                     evidence="the scaling laws need a grid with a size and a budget axis (docs/scaling.md)")]
    fits = fit_arms(runs, "longppl")
    if len(fits) < 2:
        return [Test(F, SCALING.name, verdict="not tested", evidence=f"only {list(fits)} has a size and budget axis; "
                     "the test compares two architectures or more")]
    return [_pair(a, b, fits[a], fits[b]) for a, b in itertools.combinations(fits, 2)]


def _pair(a: str, b: str, fit_a, fit_b) -> Test:
    (fa, da), (fb, db) = fit_a, fit_b
    cells_ab = pd.concat([fa.fitted, fa.held_out, fb.fitted, fb.held_out])
    n, k = float(cells_ab["n"].max()), float((cells_ab["tokens"] / cells_ab["n"]).min())
    gap = float(scaling.gap(fb.law, fa.law, n, k))
    draws = np.array([float(scaling.gap(y, x, n, k)) for x, y in zip(da, db)])
    ci = tuple(float(v) for v in np.quantile(draws, [(1 - scaling.LEVEL) / 2, (1 + scaling.LEVEL) / 2]))
    p = float(min(1.0, 2 * min((draws <= 0).mean(), (draws >= 0).mean()) + 1 / len(draws)))
    early = Comparison(f"{b} - {a}: fitted log LongPPL at N {n:.3g}, {k:.0f} tokens per parameter", gap, ci, p, 0,
                       (len(fb.fitted), len(fa.fitted)), "nats")
    c = scaling.convergence(fb.law, fa.law, db, da, n, MARGIN)
    evidence = (f"{a} and {b} within {MARGIN:g} nats of log LongPPL from {c['budget']:.3g} tokens per parameter "
                f"[95% CI {c['ci_low']:.3g}, {c['ci_high']:.3g}] at N {n:.3g}; "
                + "; ".join(f"{name}: alpha {f.law.params['alpha']:.3g}, beta {f.law.params['beta']:.3g}, held-out "
                            f"relative error up to {f.held_out['relative_error'].abs().max():.3g}"
                            for name, f in ((a, fa), (b, fb))))
    return Test(F, SCALING.named(f"{a} vs {b}"), [early], evidence,
                decide=lambda cmp, c=c: _decide(cmp, c))


def _decide(early: Comparison, c: dict) -> tuple[str, str]:
    """Reproduced: apart early (interval excludes 0, adjusted p < 0.05) and within the margin by a budget whose
    interval ends inside ``K_RANGE``; refuted: still apart at its end in 97.5% of the draws."""
    if math.isinf(c["ci_low"]):
        return "refuted", f"the fitted laws stay more than {MARGIN:g} apart up to {scaling.K_RANGE[1]:g} N"
    if early.spans_zero() or not early.p_adj < 0.05:
        return "inconclusive", "no gap shown at the smallest budget (the interval spans 0 or the p is too high)"
    if math.isinf(c["ci_high"]):
        return "inconclusive", f"the convergence budget's interval reaches beyond {scaling.K_RANGE[1]:g} N"
    return "reproduced", ""


def _plan(d: Design, _: Models) -> list[Planned]:
    """Per pair of arms with a size and a budget axis: the bootstrap p's floor (every draw on one side: 1 /
    ``scaling.RESAMPLES``), power at complete separation; none where no two arms have the axes."""
    table = arm_cells(d.configs)
    arms = sorted(arm for arm, t in table.groupby("arm") if scalable(t))
    floor = [1 / scaling.RESAMPLES]
    seeds = {arm: int(t["seed"].nunique()) for arm, t in table.groupby("arm")}
    return [Planned(F, SCALING.named(f"{a} vs {b}"), "fitted log LongPPL at the largest size and the smallest budget "
                    f"({scaling.RESAMPLES} bootstrap refits), and the budget from which the laws stay within "
                    f"{MARGIN:g}", [a, b], [seeds[a], seeds[b]], lambda _: floor, complete(lambda _: floor),
                    "complete separation (every bootstrap draw on one side)")
            for a, b in itertools.combinations(arms, 2)]


SCALING = Verdict(F, "scaling (LongPPL laws)", scaling_tests, _plan)


def write_fits(runs: Runs, out: Path, form: str = "no_constant", resamples: int | None = None,
               **options) -> list[str]:
    """Per metric of ``METRICS`` with an arm to fit: ``scaling_<metric>_parameters.csv`` (arm, parameter, value,
    ci_low, ci_high, resamples), ``scaling_<metric>_held_out.csv`` (arm, then ``ScalingFit.held_out``) and the
    figure ``scaling_<metric>.png`` (``scaling_figures.laws``). Returns the names of the files written."""
    from hybrid_lightning.analysis.figures import save
    from hybrid_lightning.analysis.scaling_figures import laws

    written = []
    for metric, (_, longppl) in METRICS.items():
        fits = fit_arms(runs, metric, form, resamples, **options)
        if not fits:
            continue
        params = pd.concat([scaling.intervals(f, d).assign(arm=arm) for arm, (f, d) in fits.items()])
        held = pd.concat([f.held_out.assign(arm=arm) for arm, (f, _) in fits.items()])
        params[["arm", *params.columns[:-1]]].to_csv(out / f"scaling_{metric}_parameters.csv", index=False)
        held[["arm", *held.columns[:-1]]].to_csv(out / f"scaling_{metric}_held_out.csv", index=False)
        save(laws({arm: f for arm, (f, _) in fits.items()}, "log LongPPL" if longppl else "held-out text loss (nats)"),
             out / f"scaling_{metric}.png")
        written += [f"scaling_{metric}_parameters.csv", f"scaling_{metric}_held_out.csv", f"scaling_{metric}.png"]
    return written


def report_section(runs: Runs, out: Path, heading: str) -> str:
    """``report.md``'s section on the scaling laws: ``write_fits``'s tables and figures, or one line where no
    architecture has a size and a budget axis."""
    written = write_fits(runs, out)
    if not written:
        return "\n".join([f"{heading}\n", "Not applicable: no architecture has finished runs at 3+ sizes and 2+ "
                          "budgets (`hybrid-lightning scaling` fits a table too; docs/scaling.md).\n"])
    text = [f"{heading}\n", "Per architecture, the paper's law (no constant) fitted to the last value of each finished "
            "run, the largest size held out and predicted; 95% bootstrap intervals of every parameter "
            f"({scaling.RESAMPLES} resamples).\n"]
    for metric, (_, longppl) in METRICS.items():
        if f"scaling_{metric}.png" in written:
            text += [f"![scaling {metric}](scaling_{metric}.png)\n", _held_out_table(
                pd.read_csv(out / f"scaling_{metric}_held_out.csv"), "log LongPPL" if longppl else "text loss in nats"),
                     f"CSV: `scaling_{metric}_parameters.csv`, `scaling_{metric}_held_out.csv`.\n"]
    if any(name.startswith("scaling_longppl") for name in written):
        text.append("The budget from which each pair's LongPPL laws stay within "
                    f"{MARGIN:g} nats, with its bootstrap interval, is in each scaling test's details above.\n")
    return "\n".join(text)


def _held_out_table(held: pd.DataFrame, quantity: str) -> str:
    """The held-out cells of one metric: measured and predicted ``quantity`` and the relative error of the
    prediction."""
    lines = [f"Held out and predicted, {quantity}:\n",
             "| arm | N | tokens | measured | predicted | relative error (predicted - measured) / measured |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r.arm} | {r.n:.3g} | {r.tokens:.3g} | {r.actual:.3f} | {r.predicted:.3f} | {r.relative_error:+.1%} |"
              for r in held.itertuples(index=False)]
    return "\n".join(lines) + "\n"
