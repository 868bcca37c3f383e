"""Verdicts on the paper's three findings (docs/analysis.md, "Findings"), each decided by a fixed rule from the
runs' tables with statistics over seeds (analysis/stats.py). ``analyze --findings`` puts them at the top
of the report (also ``findings.md``), in ``findings.csv`` (one row per test) and ``findings_comparisons.csv``.

Every test states its effect, a 95% interval over seeds (Welch's t for a difference of two arms' means,
``stats.interval``; the one-sample t for a mean of per-run values), a permutation p, the p after Holm's
adjustment over all the tests of its finding, and the seeds per arm (an arm: the runs of one
architecture). A test is ``reproduced`` with at least ``stats.MIN_SEEDS`` seeds per compared arm and an
adjusted p < ``stats.ALPHA`` in the direction the paper states, ``refuted`` when significant in the
opposite direction, otherwise ``inconclusive`` with the reason (too few seeds, CI spans 0, p too high);
``no signal`` where what the test looks at appeared in no run, ``not tested`` where the runs lack what it
needs, ``not testable at this budget`` where the runs stop before it can be seen. The tests use the
chance-corrected probe score within the training length ``longctx/token_acc`` (analysis/scores.py) and its
null standard error, the score beyond the training length for NoPE, the rise of ``val/retrieval_acc`` and
the retrieval heads of eval/heads_step_<k>.json:

1. Emergence (analysis/emergence.py): *speed*, the tokens to each run's first evaluation above noise
   (``emergence.SIGNAL_Z`` null standard errors) as censored times, restricted means and a permutation
   test of their spread; *convergence*, the fall of the spread of the architectures' seed means from its
   largest, only after every architecture has risen.
2. Mechanism. *Where*: per SWA-hybrid run with retrieval heads at its last scoring, the share of them in
   full-attention layers minus the share of full-attention heads among its scored heads (> 0: retrieval
   heads concentrate in full layers), with a head-level null (the retrieval marks moved among each run's
   heads, ``stats.stratified_p``) and a layer-level null at fixed depth (each layer's share of its run's
   retrieval heads; the full-attention marks moved among the runs' layers of the same index). Only the
   second tells attention type from depth; runs that all place their full layers at the same indices
   cannot give it, and the test is then inconclusive. The pooled count comes with its exact binomial
   interval (``scipy.stats.binomtest``). *Ablation*: per run, the probe token accuracy drop (lengths
   within training) from masking the top-K heads minus the mean drop of the random draws (mean over its
   checkpoints and K): the layer-matched controls of ``heads --mask-top K --controls N`` where the
   checkpoint has them, else the ``--mask-random K`` draws; p: the top-K masking swapped with the random
   draws of its checkpoint and K. *Laziness* (analysis/laziness.py): within each family of SWA hybrids
   with RoPE full layers alike but for the window, the first step
   from which every later scoring has a retrieval head, right-censored at the run's last scoring; for each
   pair of adjacent windows a log-rank test (``stats.logrank``) and the difference of restricted mean
   steps, larger window minus smaller. ``reproduced`` only if every pair is in the predicted direction
   (larger later), at least one is significant after adjustment and none is significantly reversed; a
   significant reversal refutes; a pair of windows none of whose runs formed a head is not testable, and
   the test is then inconclusive.
3. NoPE. For each pair of architectures differing only in ``model.pos.full``: the score beyond the training
   length, NoPE minus RoPE (> 0), and the short-context cost on held-out natural text (``val/text_loss``,
   never probe-format or synthetic documents), NoPE minus RoPE minus ``LOSS_COST`` (< 0: the cost is below
   ``LOSS_COST`` nats per token).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from scipy import stats as st

from hybrid_lightning.analysis import stats, tables
from hybrid_lightning.analysis.emergence import emergence
from hybrid_lightning.analysis.laziness import laziness_tests, swa_hybrids
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.metrics import METRICS
from hybrid_lightning.analysis.stats import Comparison, Decided, Test
from hybrid_lightning.kinds import FULL
from hybrid_lightning.records import Tag
from hybrid_lightning.units import si

SCORE = METRICS["token_acc"]
SCORE_SE = f"{SCORE}_se"
SCORE_BEYOND = f"{SCORE}_beyond"
RETRIEVAL = Tag.RETRIEVAL_ACC
TEXT_LOSS = Tag.TEXT_LOSS  # held-out natural text only (training/system.py)
LOSS_COST = 0.02  # nats per token: the short-context cost NoPE may have
TEST_COLUMNS = ["finding", "test", "verdict", "compared", "effect", "unit", "ci_low", "ci_high", "p", "p_holm", "seeds",
                "reason", "evidence"]
COMPARISON_COLUMNS = ["finding", "test", "compared", "effect", "unit", "ci_low", "ci_high", "p", "p_holm", "seeds",
                      "verdict", "reason"]


def findings(runs: Runs) -> pd.DataFrame:
    """One row per test (``TEST_COLUMNS``); see ``verdicts``."""
    return verdicts(runs)[0]


def verdicts(runs: Runs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tests, comparisons). tests: one row per test: finding, test, verdict (``reproduced``, ``refuted``,
    ``inconclusive``, ``no signal``, ``not tested``, ``not testable at this budget``), compared (the
    comparison the verdict rests on), effect, ci_low, ci_high (95% over seeds), p, p_holm (Holm over the
    finding's tests), seeds (per arm, ``5/5``), reason (why not reproduced), evidence (the numbers, in words).
    comparisons: every comparison made, with its own verdict."""
    tests, comparisons = [], []
    for group in (emergence(runs.metrics, SCORE, SCORE_SE, RETRIEVAL), _mechanism(runs), _nope(runs)):
        stats.adjust([c for t in group for c in t.comparisons])
        for t in group:
            decide = t.decide or Comparison.verdict
            decided = [(c, *decide(c)) for c in t.comparisons]  # (comparison, verdict, reason)
            tests.append(_row(t, decided))
            comparisons += [{"finding": t.finding, "test": t.test, **_numbers(c), "verdict": verdict, "reason": reason}
                            for c, verdict, reason in decided]
    return pd.DataFrame(tests, columns=TEST_COLUMNS), pd.DataFrame(comparisons, columns=COMPARISON_COLUMNS)


def _numbers(c: Comparison) -> dict:
    """A comparison's columns in the tables: compared, effect, unit, ci_low, ci_high, p, p_holm, seeds."""
    return {"compared": c.what, "effect": c.effect, "unit": c.unit, "ci_low": c.ci[0], "ci_high": c.ci[1], "p": c.p,
            "p_holm": c.p_adj, "seeds": stats.seeds_text(c.seeds)}


def _row(t: Test, decided: list[Decided]) -> dict:
    """A test's verdict from its comparisons (``decided``: each with its verdict and reason): the test's own
    ``combine`` where it has one, else reproduced where some comparison is and none is refuted, refuted the
    other way round, else inconclusive; the numbers of the comparison it rests on."""
    row = {"finding": t.finding, "test": t.test, "verdict": t.verdict, "compared": "", "effect": math.nan, "unit": "",
           "ci_low": math.nan, "ci_high": math.nan, "p": math.nan, "p_holm": math.nan, "seeds": "", "reason": t.reason,
           "evidence": t.evidence}
    if not decided:
        return row
    shown, verdict, reason = (t.combine or _combine)(decided)
    return row | _numbers(shown) | {"verdict": verdict, "reason": reason}


def _combine(decided: list[Decided]) -> Decided:
    by = {v: [d for d in decided if d[1] == v] for v in ("reproduced", "refuted")}
    if by["reproduced"] and by["refuted"]:
        return (by["reproduced"][0][0], "inconclusive",
                f"{len(by['reproduced'])} comparisons reproduced, {len(by['refuted'])} refuted")
    return stats.strongest(by["reproduced"] or by["refuted"] or decided)


def _mechanism(runs: Runs) -> list[Test]:
    return [_where(runs), _ablation(runs), *laziness_tests(runs)]


def _where(runs: Runs) -> Test:
    f, c = "2. retrieval heads", runs.configs
    h = runs.heads[runs.heads["run"].isin(c[swa_hybrids(c)]["run"])]
    if h.empty:
        return Test(f, "where", verdict="not tested", evidence="no SWA hybrid has retrieval-head scores")
    last = h[h["step"] == h.groupby("run")["step"].transform("max")]
    # Only heads that could reach a copy source compete: a head whose window never held one cannot score, so
    # counting it would make full layers win by geometry. Records without reachability (written before it was
    # recorded) compare all heads, and the evidence says so.
    reach = "reach_steps" in last and last["reach_steps"].notna().all()
    if reach:
        last = last[last["reach_steps"] > 0]
    retrieval = last["reach_retrieval" if reach else "retrieval"].astype(bool)
    last = last.assign(retrieval=retrieval, full=last["kind"].eq(FULL))
    per_run = pd.DataFrame({"heads": last["full"].groupby(last["run"]).mean(), "retrieval": retrieval.groupby(last["run"]).sum(),
                            "retrieval_full": (retrieval & last["full"]).groupby(last["run"]).sum()})
    with_heads = per_run[per_run["retrieval"] > 0]
    among = "among the heads that could reach a copy source" if reach else "among all heads (no reachability recorded)"
    k, n = int(per_run["retrieval_full"].sum()), int(per_run["retrieval"].sum())
    evidence = (f"{n} retrieval heads at the last scoring of {len(per_run)} SWA hybrids {among}, {k} in "
                f"full-attention layers, in {len(with_heads)} runs")
    if with_heads.empty:
        return Test(f, "where", verdict="no signal", evidence=evidence)
    ci = st.binomtest(k, n).proportion_ci(stats.LEVEL, method="exact")
    mine = last[last["run"].isin(with_heads.index)]
    excess = with_heads["retrieval_full"] / with_heads["retrieval"] - with_heads["heads"]
    # head-level null: within each run, the retrieval heads are any heads of that run (as many)
    head_p = stats.stratified_p([(g["full"].to_numpy(), g["retrieval"].to_numpy()) for _, g in mine.groupby("run")])
    heads = Comparison.paired("share of retrieval heads in full layers - share of heads there (head-level null)",
                              excess.to_numpy(), head_p, +1)
    depth, placements = _where_at_depth(mine)
    text = (f"; pooled share in full layers {k}/{n} = {k / n:.2f} (exact 95% CI {ci.low:.2f} to {ci.high:.2f}) vs "
            f"{(mine['full'].groupby(mine['run']).mean()).mean():.2f} of the heads; full layers at {placements}; per run: "
            + ", ".join(f"{run}: {r['retrieval_full']:.0f}/{r['retrieval']:.0f} vs {r['heads']:.2f}" for run, r in with_heads.iterrows()))
    return Test(f, "where", [heads, depth], evidence + text, combine=_where_verdict)


def _where_at_depth(last: pd.DataFrame) -> tuple[Comparison, str]:
    """The layer-level comparison at fixed depth. Per run and layer, the layer's share of the run's retrieval
    heads; per run, the share in its full layers minus the mean share of the same layer indices in the runs
    where they are all SWA layers (> 0: full attention holds more retrieval heads than the same depth does
    without it); p: the full-attention marks moved among the runs' layers of one index (``stats.stratified_p``
    with layer indices as strata). NaN where no run has such a counterpart. Also the placements, in words."""
    layers = last.groupby(["run", "layer"]).agg(full=("full", "any"), retrieval=("retrieval", "sum")).reset_index()
    layers["share"] = layers["retrieval"] / layers["run"].map(layers.groupby("run")["retrieval"].sum())
    share = layers.pivot(index="run", columns="layer", values="share")  # run x layer
    full = layers.pivot(index="run", columns="layer", values="full").fillna(False).astype(bool)
    differences = []
    for run in share.index:
        at = full.columns[full.loc[run].to_numpy()]
        others = full.index[~full[at].any(axis=1).to_numpy()]
        if len(at) and len(others):
            differences.append(share.loc[run, at].sum() - share.loc[others, at].sum(axis=1).mean())
    mixed = [(g["share"].to_numpy(), g["full"].to_numpy()) for _, g in layers.groupby("layer")]
    placements = layers[layers["full"]].groupby("run")["layer"].agg(tuple).value_counts()
    text = ", ".join(f"layers {list(p)} in {n} runs" for p, n in placements.items())
    p = stats.stratified_p(mixed) if differences else math.nan
    comparison = Comparison.paired("full-layer share - share of the same layers where SWA (layer-level null)",
                                   np.array(differences if differences else [math.nan]), p, +1)
    return comparison, text


def _where_verdict(decided: list[Decided]) -> Decided:
    """Reproduced only where the head-level and the depth-controlled comparison are; refuted where either is
    refuted; inconclusive where attention type and depth cannot be told apart."""
    (heads, hv, hr), (depth, dv, dr) = decided
    if math.isnan(depth.p):
        return heads, "inconclusive", ("attention type confounded with depth: every run has its full layers at the "
                                       "same layer indices (a placement such as FEEE beside EEEF tells them apart)"
                                       + (f"; head level: {hv}" if hv != "inconclusive" else f"; head level: {hr}"))
    if "refuted" in (hv, dv):
        return (heads, hv, hr) if hv == "refuted" else (depth, dv, dr)
    if hv == dv == "reproduced":
        return depth, "reproduced", ""
    return (depth, dv, dr) if dv != "reproduced" else (heads, hv, hr)


def _ablation(runs: Runs) -> Test:
    f = "2. retrieval heads"
    a = tables.ablation(runs.ablations, runs.configs)
    if a.empty or "top" not in set(a["selection"]) or not set(tables.DRAWS) & set(a["selection"]):
        return Test(f, "ablation", verdict="not tested",
                    evidence="no run has both a top-K head ablation and random draws (controls or random K heads)")
    a = a[a["within"]]  # within the training length, where retrieval can have formed
    draws = a.groupby([*ABLATION_KEYS, "selection", "seed", "draw"], dropna=False)["token_drop"].mean().reset_index()
    # the null draws of an experiment: its layer-matched controls where it has them, else its random K heads;
    # beside them, its draws of non-retrieval heads (Wu et al.'s contrast) where it has them
    null = draws[draws["selection"].isin(("control", "random"))]
    controlled = null["selection"].eq("control").groupby([null[k] for k in ABLATION_KEYS]).transform("any")
    nulls = {"layer-matched": null[null["selection"].eq("control") | ~controlled],
             "non-retrieval": draws[draws["selection"].eq("control_nonretrieval")]}
    tests = [_against(draws[draws["selection"] == "top"], n, name) for name, n in nulls.items() if len(n)]
    tests = [t for t in tests if t is not None]
    if not tests:
        return Test(f, "ablation", verdict="not tested", evidence="no checkpoint and K with both a top-K masking and random draws")
    return Test(f, "ablation", [c for c, _ in tests], "; ".join(text for _, text in tests))


ABLATION_KEYS = ["run", "step", "k"]  # one masking experiment: a checkpoint and a K


def _against(top: pd.DataFrame, random: pd.DataFrame, name: str) -> tuple[Comparison, str] | None:
    """The top-K maskings against one kind of random draws (``name``): per run the top-K drop minus the
    draws' mean drop; p: within each experiment the top-K masking is one more draw (``stats.stratified_p``)."""
    keys = ABLATION_KEYS
    per = pd.DataFrame({"top": top.groupby(keys)["token_drop"].mean(), "random": random.groupby(keys)["token_drop"].mean(),
                        "draws": random.groupby(keys).size()}).dropna()
    if per.empty:
        return None
    strata = {key: (np.r_[per.loc[key, "top"], g["token_drop"].to_numpy()], np.r_[True, np.zeros(len(g), bool)])
              for key, g in random.groupby(keys) if key in per.index}
    # share of the maskings at least as harmful as the top-K (the top-K counted among them)
    as_harmful = {key: (v >= v[0]).mean() for key, (v, _) in strata.items()}
    by_run = per.groupby(level="run")[["top", "random"]].mean()
    k = ", ".join(sorted({str(int(x)) for x in per.index.get_level_values("k")}))
    kind = " and ".join({"control": "layer-matched random draws", "random": "random K heads outside the top K",
                         "control_nonretrieval": "random draws of non-retrieval heads"}[s] for s in sorted(set(random["selection"])))
    comparison = Comparison.paired(f"top-K drop - {name} random-K drop (K = {k})", (by_run["top"] - by_run["random"]).to_numpy(),
                                   stats.stratified_p(list(strata.values())), +1)
    return comparison, (f"probe token accuracy drop over {len(by_run)} runs: top-K heads {by_run['top'].mean():.3f}, {kind} "
                        f"{by_run['random'].mean():.3f}; per run, step and K: "
                        + "; ".join(f"{run} step {step} K={k}: {r['top']:.3f} vs {r['random']:.3f} (draws: {int(r['draws'])}, "
                                    f"as harmful: {as_harmful[(run, step, k)]:.2f})" for (run, step, k), r in per.iterrows()))


def _nope(runs: Runs) -> list[Test]:
    f, c = "3. NoPE on full layers", runs.configs
    hybrids = c[swa_hybrids(c)].drop_duplicates("label").set_index("label")["arch"].map(json.loads)
    groups: dict[str, dict[str, str]] = {}
    for label, identity in hybrids.items():
        if "model.pos.full" in identity:
            rest = json.dumps({k: v for k, v in identity.items() if k != "model.pos.full"}, sort_keys=True, default=str)
            groups.setdefault(rest, {})[identity["model.pos.full"]] = label
    pairs = [p for p in groups.values() if {"rope", "nope"} <= p.keys()]
    if not pairs:
        return [Test(f, "beyond and cost", verdict="not tested", evidence="no SWA hybrid pair differing only in model.pos.full")]
    beyond = tables.final_values(runs.metrics, SCORE_BEYOND).set_index("run")["value"]
    loss = tables.final_values(runs.metrics, TEXT_LOSS).set_index("run")["value"]
    runs_of = c.groupby("label")["run"].agg(list)
    tests = []
    for p in pairs:
        nope, rope = runs_of[p["nope"]], runs_of[p["rope"]]
        nb, rb = beyond.reindex(nope).dropna().to_numpy(), beyond.reindex(rope).dropna().to_numpy()
        nl, rl = loss.reindex(nope).dropna().to_numpy(), loss.reindex(rope).dropna().to_numpy()
        pair = f"{p['nope']} vs {p['rope']}"
        if len(nb) and len(rb):
            tests.append(Test(f, f"beyond: {p['rope']}", [Comparison.of("NoPE - RoPE score beyond", [nb, rb], +1)],
                              f"{pair}: score beyond the training length NoPE {nb.mean():.3f} vs RoPE {rb.mean():.3f}"))
        else:
            tests.append(Test(f, f"beyond: {p['rope']}", verdict="not tested", evidence=f"{pair}: a run lacks {SCORE_BEYOND}"))
        if len(nl) and len(rl):
            cost = Comparison.of(f"NoPE - RoPE {TEXT_LOSS} - {LOSS_COST}", [nl - LOSS_COST, rl], -1, unit="nats")
            tests.append(Test(f, f"cost: {p['rope']}", [cost], f"{pair}: {TEXT_LOSS} NoPE {nl.mean():.4f} vs RoPE "
                               f"{rl.mean():.4f} (cost {nl.mean() - rl.mean():+.4f} nats; allowed {LOSS_COST})"))
        else:
            tests.append(Test(f, f"cost: {p['rope']}", verdict="not tested", evidence=f"{pair}: a run lacks {TEXT_LOSS} "
                              "(the loss on held-out natural text; val/loss is on data.files, which may be probe documents)"))
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
