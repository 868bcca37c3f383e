"""Large-Window Laziness (analysis/findings.py, finding 2): among SWA hybrids with RoPE full layers, the first
step from which every later scoring has a retrieval head *in a full-attention layer* (the paper's laziness is
about the full layers' heads; which layers are full is the run plan's), right-censored at the run's last
scoring; per pair of adjacent windows of one family (hybrids alike but for the window) a log-rank test and the
difference of restricted mean steps, larger window minus smaller, combined by ``_monotone``. The first step
with a retrieval head in a windowed layer is reported beside it as context, never in the statistic."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import power as pw
from hybrid_lightning.analysis import stats, tables
from hybrid_lightning.analysis.arms import swa_hybrids
from hybrid_lightning.analysis.emergence import NOT_TESTABLE
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.mechanism import F
from hybrid_lightning.analysis.stats import Comparison, Decided, Test
from hybrid_lightning.analysis.survival import km_median, logrank
from hybrid_lightning.analysis.verdict import Design, Models, Planned, Verdict, at_least, two_arms


def window_families(c: pd.DataFrame) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """(the SWA hybrids with RoPE full layers, their families of two windows or more): hybrids alike but for
    the window (another pattern, e.g. a depth control, is another family), each family's rows of ``c``."""
    rope = c[swa_hybrids(c) & c["model.pos.full"].eq("rope")]
    family = rope["arch"].map(lambda a: json.dumps({k: v for k, v in json.loads(a).items() if k != "model.window"},
                                                   sort_keys=True, default=str))
    return rope, [g for _, g in rope.groupby(family, sort=False) if g["model.window"].nunique() >= 2]


def laziness_tests(runs: Runs) -> list[Test]:
    """One laziness test per family of ``window_families``; a family of one window is not tested. With one
    family tested the test is ``laziness``, with several ``laziness: <first run's label>``."""
    rope, families = window_families(runs.configs)
    if len(families) <= 1:
        return [_laziness(runs, families[0] if families else rope, LAZINESS.name)]
    return [_laziness(runs, g, LAZINESS.named(g["label"].iloc[0])) for g in families]


def first_heads(runs: Runs, names: list[str]) -> pd.DataFrame:
    """Per run of ``names`` with per-head scores: run, window, scored_until (its last scoring), first_step (the
    first scoring from which every later one has a retrieval head in a full-attention layer of its plan; NaN:
    none yet) and first_windowed (the same for its windowed layers: context)."""
    h = runs.heads[runs.heads["run"].isin(names)]
    full = runs.configs.set_index("run")["full_layers"].map(lambda t: {int(x) for x in str(t).split(",") if x})
    h = h.assign(full=[layer in full[run] for run, layer in zip(h["run"], h["layer"])],
                 retrieval=h["retrieval"].astype(bool))
    counts = h.groupby(["run", "step", "full"])["retrieval"].sum().unstack("full", fill_value=0)  # (run, step) x full
    window, rows = tables.windows(runs.configs), []
    for run, g in counts.groupby(level="run"):
        g = g.droplevel("run").sort_index()
        rows.append({"run": run, "window": window[run], "scored_until": g.index.max(),
                     "first_step": _held(g.get(True)), "first_windowed": _held(g.get(False))})
    return pd.DataFrame(rows, columns=["run", "window", "scored_until", "first_step", "first_windowed"])


def _held(counts: pd.Series | None) -> float:
    """The first step from which every later count is at least 1 (reverse cumulative minimum), NaN if none."""
    if counts is None:
        return math.nan
    hit = counts[counts.iloc[::-1].cummin().iloc[::-1] >= 1]
    return float(hit.index[0]) if len(hit) else math.nan


def _laziness(runs: Runs, rope: pd.DataFrame, name: str) -> Test:
    first = first_heads(runs, list(rope["run"]))
    if first["window"].nunique() < 2:
        return Test(F, name, verdict="not tested", evidence="fewer than two SWA windows with retrieval-head scores")
    first = first.assign(event=first["first_step"].notna(), time=first["first_step"].fillna(first["scored_until"]))
    by_window = {int(w): g for w, g in first.groupby("window")}
    evidence = ("first step with a retrieval head for good in a full-attention layer, per window (seeds; never (S): "
                "none by the last scoring at step S, a censored time): "
                + "; ".join(f"W={w}: {_first_steps(g)}" for w, g in by_window.items())
                + "; beside it (context, not in the statistic), the same in the windowed layers: "
                + "; ".join(f"W={w}: " + ", ".join("never" if math.isnan(t) else str(int(t))
                                                    for t in g["first_windowed"]) for w, g in by_window.items()))
    if not first["event"].any():
        return Test(F, name, verdict="no signal", evidence=evidence)
    windows = sorted(by_window)
    pairs = [_window_pair(by_window[a], by_window[b], a, b) for a, b in zip(windows, windows[1:])]
    return Test(F, name, pairs, evidence, decide=_pair_verdict, combine=_monotone)


def _first_steps(g: pd.DataFrame) -> str:
    steps = ", ".join(str(int(t)) if e else f"never ({int(t)})" for t, e in zip(g["time"], g["event"]))
    median = km_median(g["time"], g["event"])
    return steps + f" (Kaplan-Meier median {'not reached' if math.isnan(median) else f'{median:.0f}'})"


def _window_pair(small: pd.DataFrame, large: pd.DataFrame, ws: int, wl: int) -> Comparison:
    """Log-rank test of two windows' censored first-head steps, and their restricted means up to the earlier of
    the two arms' last scorings (every run is observed until then): larger window minus smaller, > 0 as
    laziness predicts; Welch's interval."""
    tau = min(small["scored_until"].min(), large["scored_until"].min())
    a, b = np.minimum(small["time"], tau).to_numpy(float), np.minimum(large["time"], tau).to_numpy(float)
    z, p = logrank((small["time"].to_numpy(), small["event"].to_numpy()),
                   (large["time"].to_numpy(), large["event"].to_numpy()))
    what = (f"W={wl} - W={ws} restricted mean first-head step (log-rank z {z:+.2f})" if not math.isnan(z)
            else f"W={wl} - W={ws}")
    return Comparison(what, float(b.mean() - a.mean()), stats.interval(b, a), p, +1, (len(b), len(a)), "steps")


def _pair_verdict(c: Comparison) -> tuple[str, str]:
    if math.isnan(c.p):
        return NOT_TESTABLE, "no run of either window formed a retrieval head (both arms censored)"
    return c.verdict()


def _monotone(decided: list[Decided]) -> Decided:
    """Reproduced if every adjacent pair is in the predicted direction, one is significant and none is
    significantly reversed; refuted by a significant reversal; else inconclusive with the reason."""
    reversed_ = [d for d in decided if d[1] == "refuted"]
    if reversed_:
        c, _, _ = stats.strongest(reversed_)
        return c, "refuted", f"{_pair_name(c)}: significantly earlier for the larger window"
    untestable = [d for d in decided if d[1] in (NOT_TESTABLE, stats.BY_DESIGN)]
    against = [d for d in decided if d not in untestable and not d[0].effect > 0]
    if untestable or against:
        shown = (untestable or against)[0]
        why = [f"{_pair_name(d[0])}: not testable (" + ("both arms censored" if d[1] == NOT_TESTABLE else d[2]) + ")"
               for d in untestable]
        why += [f"{_pair_name(d[0])}: " + ("against the predicted direction" if d[0].effect < 0 else
                                          "no difference up to the earlier last scoring") for d in against]
        return shown[0], "inconclusive", "; ".join(why)
    significant = [d for d in decided if d[1] == "reproduced"]
    if significant:
        return stats.strongest(significant)[0], "reproduced", ""
    c, verdict, reason = stats.strongest(decided)
    return c, verdict, f"every pair in the predicted direction, none significant ({reason})"


def _pair_name(c: Comparison) -> str:
    """``W=64 - W=32`` of a window pair's comparison."""
    return c.what.split(" restricted")[0]


def _plan(d: Design, models: Models) -> list[Planned]:
    _, fams = window_families(d.configs)
    out = []
    for g in fams:
        labels = sorted(g["label"].unique(), key=lambda label: d.plan(label).window)
        windows = [d.plan(label).window for label in labels]
        effect, simulate = models(LAZINESS, labels, d.steps(labels[0], "eval.heads"))
        out.append(Planned(F, LAZINESS.named(g["label"].iloc[0] if len(fams) > 1 else ""), "log-rank of adjacent "
                           "windows " + ", ".join(f"W={b} vs W={a}" for a, b in zip(windows, windows[1:])), labels,
                           d.seeds(labels), lambda s: at_least(s, [two_arms(a, b) for a, b in zip(s, s[1:])]), simulate,
                           effect, needs="any", why=d.untimed(labels[0], "eval.heads")))
    return out


def _default(labels: list[str], steps: np.ndarray) -> pw.Model:
    """Each larger window ``DEFAULT_EFFECT`` seed SDs later than the one before (censored times)."""
    return pw.censored([i * pw.DEFAULT_EFFECT for i in range(len(labels))], steps)


def _passes(arms: list, alpha: float) -> np.ndarray:
    """Every adjacent pair later for the larger window, one of them significant (``_monotone``)."""
    pairs = [pw.logrank_passes(a, b, alpha) for a, b in zip(arms, arms[1:])]
    return np.all([later for _, later in pairs], axis=0) & np.any([p for p, _ in pairs], axis=0)


def _samples(pilot: Runs, runs: list[list[str]]) -> list | None:
    """Per arm, each run's first step with a retrieval head for good in a full layer as a share of its last
    scoring, censored where none came: (times, events)."""
    first = first_heads(pilot, sum(runs, [])).set_index("run")
    if any(not set(r) <= set(first.index) for r in runs):
        return None
    step, until = first["first_step"], first["scored_until"]
    return [((step.loc[r].fillna(until.loc[r]) / until.loc[r]).to_numpy(), step.loc[r].notna().to_numpy())
            for r in runs]


LAZINESS = Verdict(F, "laziness", laziness_tests, _plan, _default, _passes, _samples)
