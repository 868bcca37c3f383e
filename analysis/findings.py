"""Verdicts on the paper's three findings (docs/analysis.md, "Findings"), each decided by a fixed rule from the
runs' tables with statistics over seeds (analysis/stats.py). ``analyze --findings`` puts them at the top
of the report (also ``findings.md``), in ``findings.csv`` (one row per test) and ``findings_comparisons.csv``.

Every test states its effect, a 95% bootstrap CI over seeds, a two-sided permutation p, the p after
Holm's adjustment over all the tests of its finding, and the seeds per arm (an arm: the runs of one
architecture). A test is ``reproduced`` with at least ``stats.MIN_SEEDS`` seeds per compared arm and an
adjusted p < ``stats.ALPHA`` in the direction the paper states, ``refuted`` when significant in the
opposite direction, otherwise ``inconclusive`` with the reason (too few seeds, CI spans 0, p too high);
``no signal`` where what the test looks at appeared in no run, ``not tested`` where the runs lack what it
needs. The tests use the chance-corrected probe score ``longctx/token_acc`` (analysis/scores.py), the rise
of ``val/retrieval_acc`` and the retrieval heads of eval/heads_step_<k>.json:

1. Emergence, of the probe score and of the rise of ``val/retrieval_acc`` over the mean of each run's first
   ``START_VALIDATIONS`` validations. Signal: some architecture ends with a seed-mean value >= ``SIGNAL``.
   *Speed*: the tokens at which each seed first reaches one absolute level, ``SPEED_FRACTION`` of the lowest
   seed peak among the architectures every seed of which rises to ``SIGNAL`` (so every compared seed reaches
   it; an architecture that does not is left out, never counted as slower). p: permutation test of the
   spread of the architectures' mean tokens; effect: slowest minus fastest mean. *Convergence*: the
   spread (standard deviation) of the architectures' seed means at the evaluation halfway through the
   common steps minus at the last common one; positive when they draw together.
2. Mechanism. *Where*: per SWA-hybrid run with retrieval heads at its last scoring, the share of them in
   full-attention layers minus the share of full-attention heads among its scored heads (> 0: retrieval
   heads concentrate in full layers); p: the retrieval marks moved among each run's heads
   (``stats.stratified_p``). *Ablation*: per run, the probe token accuracy drop (lengths within training)
   from masking the top-K heads minus the mean drop of the random draws (mean over its checkpoints and
   K): the layer-matched controls of ``heads --mask-top K --controls N`` where the checkpoint has them, else
   the ``--mask-random K`` draws; p: the top-K masking swapped with the random draws of its checkpoint and
   K. *Laziness*: among SWA hybrids with RoPE full layers, the rank correlation between the window and the
   first step from which every later scoring has a retrieval head (a run without one ranks after every run
   with one); > 0: larger windows form heads later.
3. NoPE. For each pair of architectures differing only in ``model.pos.full``: the score beyond the training
   length, NoPE minus RoPE (> 0), and the short-context cost, NoPE minus RoPE ``val/loss`` minus
   ``LOSS_COST`` (< 0: the cost is below ``LOSS_COST`` nats per token).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import stats, tables
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.stats import Comparison
from hybrid_lightning.kinds import FULL, KINDS
from hybrid_lightning.units import si

SCORE = "longctx/token_acc"
SCORE_BEYOND = "longctx/token_acc_beyond"
RETRIEVAL = "val/retrieval_acc"
START_VALIDATIONS = 3  # the rise of val/retrieval_acc is over the mean of a run's first 3 validations
SIGNAL = 0.05  # answer-token accuracy above chance that counts as retrieval
SPEED_FRACTION = 0.5  # the speed level: this share of the lowest seed peak among the compared architectures
LOSS_COST = 0.02  # nats per token: the short-context cost NoPE may have
TEST_COLUMNS = ["finding", "test", "verdict", "compared", "effect", "unit", "ci_low", "ci_high", "p", "p_holm", "seeds",
                "reason", "evidence"]
COMPARISON_COLUMNS = ["finding", "test", "compared", "effect", "unit", "ci_low", "ci_high", "p", "p_holm", "seeds",
                      "verdict", "reason"]


@dataclass
class _Test:
    """One test of a finding: its comparisons (none where the verdict is fixed) and its evidence in words."""

    finding: str
    test: str
    comparisons: list[Comparison] = field(default_factory=list)
    evidence: str = ""
    verdict: str = ""  # fixed verdict (``no signal``, ``not tested``, ``inconclusive``) where nothing is compared
    reason: str = ""


def findings(runs: Runs) -> pd.DataFrame:
    """One row per test (``TEST_COLUMNS``); see ``verdicts``."""
    return verdicts(runs)[0]


def verdicts(runs: Runs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tests, comparisons). tests: one row per test: finding, test, verdict (``reproduced``, ``refuted``,
    ``inconclusive``, ``no signal``, ``not tested``), compared (the comparison the verdict rests on), effect,
    ci_low, ci_high (95% bootstrap over seeds), p, p_holm (Holm over the finding's tests), seeds (per arm,
    ``5/5``), reason (why inconclusive), evidence (the numbers, in words). comparisons: every comparison
    made, with its own verdict."""
    tests, comparisons = [], []
    for group in (_emergence(runs), _mechanism(runs), _nope(runs)):
        stats.adjust([c for t in group for c in t.comparisons])
        for t in group:
            decided = [(c, *c.verdict()) for c in t.comparisons]  # (comparison, verdict, reason)
            tests.append(_row(t, decided))
            comparisons += [{"finding": t.finding, "test": t.test, **_numbers(c), "verdict": verdict, "reason": reason}
                            for c, verdict, reason in decided]
    return pd.DataFrame(tests, columns=TEST_COLUMNS), pd.DataFrame(comparisons, columns=COMPARISON_COLUMNS)


def _numbers(c: Comparison) -> dict:
    """A comparison's columns in the tables: compared, effect, unit, ci_low, ci_high, p, p_holm, seeds."""
    return {"compared": c.what, "effect": c.effect, "unit": c.unit, "ci_low": c.ci[0], "ci_high": c.ci[1], "p": c.p,
            "p_holm": c.p_adj, "seeds": stats.seeds_text(c.seeds)}


def _row(t: _Test, decided: list[tuple[Comparison, str, str]]) -> dict:
    """A test's verdict from its comparisons (``decided``: each with its verdict and reason): reproduced where
    some comparison is and none is refuted, refuted the other way round, else inconclusive; the numbers of the
    comparison it rests on."""
    row = {"finding": t.finding, "test": t.test, "verdict": t.verdict, "compared": "", "effect": math.nan, "unit": "",
           "ci_low": math.nan, "ci_high": math.nan, "p": math.nan, "p_holm": math.nan, "seeds": "", "reason": t.reason,
           "evidence": t.evidence}
    if not decided:
        return row
    by = {v: [d for d in decided if d[1] == v] for v in ("reproduced", "refuted")}
    if by["reproduced"] and by["refuted"]:
        shown, verdict = by["reproduced"][0], "inconclusive"
        reason = f"{len(by['reproduced'])} comparisons reproduced, {len(by['refuted'])} refuted"
    else:
        pool = by["reproduced"] or by["refuted"] or decided
        shown = min(pool, key=lambda d: (_nan_last(d[0].p_adj), -abs(d[0].effect)))
        verdict, reason = shown[1], shown[2]
    return row | _numbers(shown[0]) | {"verdict": verdict, "reason": reason}


def _nan_last(p: float) -> float:
    return math.inf if math.isnan(p) else p


def _emergence(runs: Runs) -> list[_Test]:
    tests = _emergence_of(runs.metrics, SCORE, "probes")
    # In-context retrieval at the training length on synthetic validation sequences: each run's rise
    # over the mean of its first validations (chance is not logged for it).
    acc = runs.metrics[runs.metrics["metric"] == RETRIEVAL].sort_values("step")
    start = acc.groupby("run")["value"].transform(lambda v: v.iloc[:START_VALIDATIONS].mean())
    rise = acc.assign(value=acc["value"] - start)
    return tests + _emergence_of(rise, RETRIEVAL, "val/retrieval_acc rise")


def _emergence_of(metrics: pd.DataFrame, tag: str, what: str) -> list[_Test]:
    f = "1. emergence speed"
    curve = tables.curves(metrics, tag)
    if curve.empty:
        return [_Test(f, f"speed ({what})", verdict="not tested", evidence=f"no run has logged {tag}")]
    final = curve.sort_values("step").groupby("label").last()["mean"]
    finals = ", ".join(f"{label}: {v:.3f}" for label, v in final.sort_values(ascending=False).items())
    if final.max() < SIGNAL:
        text = f"final seed-mean {what} below {SIGNAL} for every architecture ({finals})"
        return [_Test(f, f"speed ({what})", verdict="no signal", evidence=text),
                _Test(f, f"convergence ({what})", verdict="no signal", evidence=text)]
    # each run's values at the steps every seed of its architecture has reached: run x step
    d = metrics[metrics["metric"] == tag].merge(curve[["label", "step"]], on=["label", "step"])
    values = d.pivot_table(index="run", columns="step", values="value")
    tokens = d.pivot_table(index="run", columns="step", values="tokens")
    arms = {label: sorted(g["run"].unique()) for label, g in d.groupby("label")}
    return [_speed(f, what, values, tokens, arms), _convergence(f, what, values, arms, finals)]


def _speed(f: str, what: str, values: pd.DataFrame, tokens: pd.DataFrame, arms: dict[str, list[str]]) -> _Test:
    peaks = values.max(axis=1)
    reach = {label: runs for label, runs in arms.items() if peaks[runs].min() >= SIGNAL}
    left_out = sorted(set(arms) - set(reach))
    out = f"; left out (a seed stays below {SIGNAL}): {', '.join(left_out)}" if left_out else ""
    if len(reach) < 2:
        return _Test(f, f"speed ({what})", verdict="inconclusive", reason=f"fewer than two architectures reach {SIGNAL} in every seed",
                     evidence=f"architectures whose every seed reaches {SIGNAL}: {', '.join(reach) or 'none'}{out}")
    level = SPEED_FRACTION * min(peaks[runs].min() for runs in reach.values())
    # tokens at the first evaluation at or above the level: every seed of these arms has one
    first = pd.Series(tokens.to_numpy()[np.arange(len(values)), values.ge(level).to_numpy().argmax(axis=1)], values.index)
    samples = {label: first[runs].to_numpy(float) for label, runs in reach.items()}
    order = sorted(samples, key=lambda k: samples[k].mean())
    fastest, slowest = order[0], order[-1]
    arms = [samples[k] for k in order]
    comparison = Comparison(f"{slowest} - {fastest}", float(samples[slowest].mean() - samples[fastest].mean()),
                            stats.bootstrap_ci([samples[slowest], samples[fastest]]),
                            stats.permutation_p(arms, _spread, upper=True), 0, tuple(len(a) for a in arms), "tokens")
    means = "; ".join(f"{k}: {si(samples[k].mean())} ({len(samples[k])} seed{'s' * (len(samples[k]) > 1)})" for k in order)
    return _Test(f, f"speed ({what})", [comparison],
                 f"level {level:.3f}; mean tokens to reach it: {means}{out}. p: spread of the {len(arms)} "
                 "architectures' means under relabelling of seeds")


def _spread(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Between-architecture sum of squares of the arms' means (the one-way ANOVA numerator): (B, N) -> (B,)."""
    grand = x.mean(axis=1)
    return sum((groups == g).sum() * (x[:, groups == g].mean(axis=1) - grand) ** 2 for g in np.unique(groups))


def _spread_shrink(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Rows (value halfway, value at the last common step): the standard deviation of the arms' means halfway
    minus at the end; positive when the architectures draw together. (B, N, 2) -> (B,)."""
    means = np.stack([x[:, groups == g].mean(axis=1) for g in np.unique(groups)], axis=1)  # (B, arms, 2)
    sd = means.std(axis=1)  # (B, 2)
    return sd[:, 0] - sd[:, 1]


def _convergence(f: str, what: str, values: pd.DataFrame, arms: dict[str, list[str]], finals: str) -> _Test:
    test = f"convergence ({what})"
    common = values.dropna(axis=1)
    steps = list(common.columns)
    if len(arms) < 2 or len(steps) < 2:
        return _Test(f, test, verdict="not tested", evidence="fewer than two architectures or common evaluation steps")
    middle = steps[(len(steps) - 1) // 2]  # the evaluation halfway through the common steps
    rows = [common.loc[runs, [middle, steps[-1]]].to_numpy(float) for runs in arms.values()]
    comparison = Comparison.of(f"spread at step {middle} - at step {steps[-1]}", rows, +1, _spread_shrink)
    sd = [np.std([r[:, i].mean() for r in rows]) for i in (0, 1)]
    return _Test(f, test, [comparison], f"standard deviation of the {len(arms)} architectures' seed means: "
                 f"{sd[0]:.3f} at step {middle}, {sd[1]:.3f} at step {steps[-1]}; finals {finals}")


def _swa_hybrids(c: pd.DataFrame) -> pd.Series:
    """Runs whose model.mixer has a window and appears in the pattern."""
    windowed = c["model.mixer"].map(lambda m: m in KINDS and KINDS[m].has_window)
    return windowed & c["model.pattern"].astype(str).str.contains("E")


def _mechanism(runs: Runs) -> list[_Test]:
    return [_where(runs), _ablation(runs), _laziness(runs)]


def _where(runs: Runs) -> _Test:
    f, c = "2. retrieval heads", runs.configs
    h = runs.heads[runs.heads["run"].isin(c[_swa_hybrids(c)]["run"])]
    if h.empty:
        return _Test(f, "where", verdict="not tested", evidence="no SWA hybrid has retrieval-head scores")
    last = h[h["step"] == h.groupby("run")["step"].transform("max")]
    # Only heads that could reach a copy source compete: a head whose window never held one cannot score, so
    # counting it would make full layers win by geometry. Records without reachability (written before it was
    # recorded) compare all heads, and the evidence says so.
    reach = "reach_steps" in last and last["reach_steps"].notna().all()
    if reach:
        last = last[last["reach_steps"] > 0]
    retrieval = last["reach_retrieval" if reach else "retrieval"].astype(bool)
    last = last.assign(retrieval=retrieval)
    full = last["kind"].eq(FULL)
    per_run = pd.DataFrame({"heads": full.groupby(last["run"]).mean(), "retrieval": retrieval.groupby(last["run"]).sum(),
                            "retrieval_full": (retrieval & full).groupby(last["run"]).sum()})
    with_heads = per_run[per_run["retrieval"] > 0]
    among = "among the heads that could reach a copy source" if reach else "among all heads (no reachability recorded)"
    evidence = (f"{int(per_run['retrieval'].sum())} retrieval heads at the last scoring of {len(per_run)} SWA hybrids "
                f"{among}, {int(per_run['retrieval_full'].sum())} in full-attention layers, in {len(with_heads)} runs")
    if with_heads.empty:
        return _Test(f, "where", verdict="no signal", evidence=evidence)
    excess = with_heads["retrieval_full"] / with_heads["retrieval"] - with_heads["heads"]
    # null: within each run, the retrieval heads are any heads of that run (as many)
    p = stats.stratified_p([(g["kind"].eq(FULL).to_numpy(), g["retrieval"].to_numpy())
                            for _, g in last[last["run"].isin(with_heads.index)].groupby("run")])
    comparison = Comparison.paired("share of retrieval heads in full layers - share of heads there", excess.to_numpy(), p, +1)
    return _Test(f, "where", [comparison], evidence + "; per run: "
                 + ", ".join(f"{run}: {r['retrieval_full']:.0f}/{r['retrieval']:.0f} vs {r['heads']:.2f}"
                             for run, r in with_heads.iterrows()))


def _ablation(runs: Runs) -> _Test:
    f = "2. retrieval heads"
    a = tables.ablation(runs.ablations, runs.configs)
    if a.empty or "top" not in set(a["selection"]) or not set(tables.DRAWS) & set(a["selection"]):
        return _Test(f, "ablation", verdict="not tested",
                     evidence="no run has both a top-K head ablation and random draws (controls or random K heads)")
    a = a[a["within"]]  # within the training length, where retrieval can have formed
    keys = ["run", "step", "k"]  # one masking experiment: a checkpoint and a K
    draws = a.groupby([*keys, "selection", "seed", "draw"], dropna=False)["token_drop"].mean().reset_index()
    # the null draws of an experiment: its layer-matched controls where it has them, else its random K heads
    null = draws[draws["selection"].isin(tables.DRAWS)]
    controlled = null["selection"].eq("control").groupby([null[k] for k in keys]).transform("any")
    random = null[null["selection"].eq("control") | ~controlled]
    per = pd.DataFrame({"top": draws[draws["selection"] == "top"].groupby(keys)["token_drop"].mean(),
                        "random": random.groupby(keys)["token_drop"].mean(),
                        "draws": random.groupby(keys).size()}).dropna()
    if per.empty:
        return _Test(f, "ablation", verdict="not tested", evidence="no checkpoint and K with both a top-K masking and random draws")
    # null: within each experiment, the top-K masking is one more random draw of K heads
    strata = {key: (np.r_[per.loc[key, "top"], g["token_drop"].to_numpy()], np.r_[True, np.zeros(len(g), bool)])
              for key, g in random.groupby(keys) if key in per.index}
    # share of the maskings at least as harmful as the top-K (the top-K counted among them)
    as_harmful = {key: (v >= v[0]).mean() for key, (v, _) in strata.items()}
    by_run = per.groupby(level="run")[["top", "random"]].mean()
    k = ", ".join(sorted({str(int(x)) for x in per.index.get_level_values("k")}))
    kind = " and ".join({"control": "layer-matched random draws", "random": "random K heads outside the top K"}[s]
                        for s in sorted(set(random["selection"])))
    comparison = Comparison.paired(f"top-K drop - random-K drop (K = {k})", (by_run["top"] - by_run["random"]).to_numpy(),
                                   stats.stratified_p(list(strata.values())), +1)
    return _Test(f, "ablation", [comparison],
                 f"probe token accuracy drop over {len(by_run)} runs: top-K heads {by_run['top'].mean():.3f}, {kind} "
                 f"{by_run['random'].mean():.3f}; per run, step and K: "
                 + "; ".join(f"{run} step {step} K={k}: {r['top']:.3f} vs {r['random']:.3f} (draws: {int(r['draws'])}, "
                             f"as harmful: {as_harmful[(run, step, k)]:.2f})" for (run, step, k), r in per.iterrows()))


def _laziness(runs: Runs) -> _Test:
    f, c = "2. retrieval heads", runs.configs
    rope = c[_swa_hybrids(c) & c["model.pos.full"].eq("rope")]
    first = tables.first_heads(runs.metrics[runs.metrics["run"].isin(rope["run"])], c)
    if first["window"].nunique() < 2:
        return _Test(f, "laziness", verdict="not tested", evidence="fewer than two SWA windows with retrieval-head scores")
    by_window = first.groupby("window")
    evidence = ("first step with a retrieval head for good, per window (seeds; never = none by the end; mean and 95% "
                "bootstrap CI where every seed has one): "
                + "; ".join(f"W={int(w)}: {', '.join('never' if np.isnan(x) else str(int(x)) for x in g['first_step'])}"
                            + _mean_with_ci(g["first_step"].to_numpy(float)) for w, g in by_window))
    if first["first_step"].isna().all():
        return _Test(f, "laziness", verdict="no signal", evidence=evidence)
    arms = [g["first_step"].fillna(np.inf).to_numpy(float) for _, g in by_window]  # never ranks last
    comparison = Comparison.of("rank correlation of window and first-head step", arms, +1, stats.rank_correlation)
    return _Test(f, "laziness", [comparison], evidence)


def _mean_with_ci(steps: np.ndarray) -> str:
    low, high = stats.mean_ci(steps)
    return "" if np.isnan(low) else f" (mean {steps.mean():.0f}, CI {low:.0f} to {high:.0f})"


def _nope(runs: Runs) -> list[_Test]:
    f, c = "3. NoPE on full layers", runs.configs
    arch = c.drop_duplicates("label").set_index("label")["arch"].map(json.loads)
    groups: dict[str, dict[str, str]] = {}
    for label, identity in arch.items():
        mixer = identity.get("model.mixer")
        if mixer in KINDS and KINDS[mixer].has_window and "model.pos.full" in identity:
            rest = json.dumps({k: v for k, v in identity.items() if k != "model.pos.full"}, sort_keys=True, default=str)
            groups.setdefault(rest, {})[identity["model.pos.full"]] = label
    pairs = [p for p in groups.values() if {"rope", "nope"} <= p.keys()]
    if not pairs:
        return [_Test(f, "beyond and cost", verdict="not tested", evidence="no SWA hybrid pair differing only in model.pos.full")]
    beyond = tables.final_values(runs.metrics, SCORE_BEYOND).set_index("run")["value"]
    loss = tables.final_values(runs.metrics, "val/loss").set_index("run")["value"]
    runs_of = c.groupby("label")["run"].agg(list)
    tests = []
    for p in pairs:
        nope, rope = runs_of[p["nope"]], runs_of[p["rope"]]
        nb, rb = beyond.reindex(nope).dropna().to_numpy(), beyond.reindex(rope).dropna().to_numpy()
        nl, rl = loss.reindex(nope).dropna().to_numpy(), loss.reindex(rope).dropna().to_numpy()
        pair = f"{p['nope']} vs {p['rope']}"
        if len(nb) and len(rb):
            tests.append(_Test(f, f"beyond: {p['rope']}", [Comparison.of("NoPE - RoPE score beyond", [nb, rb], +1)],
                               f"{pair}: score beyond the training length NoPE {nb.mean():.3f} vs RoPE {rb.mean():.3f}"))
        else:
            tests.append(_Test(f, f"beyond: {p['rope']}", verdict="not tested", evidence=f"{pair}: a run lacks {SCORE_BEYOND}"))
        if len(nl) and len(rl):
            cost = Comparison.of(f"NoPE - RoPE val/loss - {LOSS_COST}", [nl - LOSS_COST, rl], -1, unit="nats")
            tests.append(_Test(f, f"cost: {p['rope']}", [cost], f"{pair}: val/loss NoPE {nl.mean():.4f} vs RoPE "
                               f"{rl.mean():.4f} (cost {nl.mean() - rl.mean():+.4f} nats; allowed {LOSS_COST})"))
        else:
            tests.append(_Test(f, f"cost: {p['rope']}", verdict="not tested", evidence=f"{pair}: a run lacks val/loss"))
    return tests


def markdown(tests: pd.DataFrame, comparisons: pd.DataFrame) -> str:
    """The findings table (verdict, effect with its CI, p and Holm p, seeds per arm, reason) and, below it,
    the details: each test's evidence and every comparison it made."""
    lines = ["| finding | test | verdict | effect [95% CI] | p (Holm) | seeds per arm | reason |", "|---|---|---|---|---|---|---|"]
    for t in tests.itertuples(index=False):
        numbers = ["", "", ""] if not t.compared else [
            f"{_num(t.effect)}{_unit(t.unit)} [{_num(t.ci_low)}, {_num(t.ci_high)}]", f"{t.p:.3g} ({t.p_holm:.3g})", t.seeds]
        lines.append(f"| {t.finding} | {t.test} | {t.verdict} | {' | '.join(numbers)} | {t.reason} |")
    lines += ["", "### Details", ""]
    for t in tests.itertuples(index=False):
        lines.append(f"- **{t.finding}, {t.test}**: {t.evidence}.")
        for c in comparisons[(comparisons["finding"] == t.finding) & (comparisons["test"] == t.test)].itertuples(index=False):
            lines.append(f"  - {c.compared}: {_num(c.effect)}{_unit(c.unit)} [95% CI {_num(c.ci_low)}, {_num(c.ci_high)}], "
                         f"p {c.p:.3g}, Holm {c.p_holm:.3g}, seeds {c.seeds}: {c.verdict}" + (f"; {c.reason}" if c.reason else ""))
    return "\n".join(lines) + "\n"


def _unit(unit) -> str:
    return f" {unit}" if isinstance(unit, str) and unit else ""


def _num(v: float) -> str:
    return "nan" if pd.isna(v) else si(v)
