"""Finding 2's *where* and *ablation* tests (analysis/findings.py; laziness: analysis/laziness.py).

*Where*: among the heads that could reach a copy source (``reach_steps`` > 0; all heads in records written
before reachability was), per SWA-hybrid run with retrieval heads at its last scoring, the share of them in
full-attention layers minus the share of its heads there. Head-level null: the retrieval marks moved among
each run's heads (``stats.stratified_p``; runs whose reachable heads are all of one kind cannot compare and
are left out). Layer-level null, the one that tells attention type from depth: each reachable layer's share
of its run's retrieval heads; strata are (window, layer index), and within a stratum the full-attention
marks are moved among the runs' layers, so that a full layer competes only with windowed layers of the same
depth and window that could have held a retrieval head. Runs whose full layers all sit at one index, or
windows none of whose layers at that index can reach a source, cannot give it: the test is then not
testable. ``reproduced`` needs both nulls rejected.

*Ablation*, per architecture with the seed as the unit: per checkpoint and K, the probe token-accuracy drop
(lengths within training) from masking the top-K heads minus the mean drop of its distinct controls, then
per run the mean over its checkpoints. A control draw counts only where it masks, layer by layer, as many
heads as the top-K has there, none of them in the top-K and none a retrieval head by the held-out selection
report (``eval.heads.selection_seed``; the scored report's marks for records without one): whatever the
run's files call it. A control is a distinct head set: draws of the same set are one control (their mean
drop), never several. p: within each checkpoint the top-K masking moved among its distinct controls,
checkpoints as strata, each run weighing as one (``stats.stratified_p``, exact up to 50,000 placements);
interval: one-sample t over its runs. A checkpoint whose top-K fills a layer (K >= heads per layer there)
has no such control: that architecture is not testable; where its distinct controls are so few that the
exact p cannot fall below ``ALPHA`` (4 heads, K = 2: one set per run, 2 / 2^3 = 0.25 at 3 seeds), its claim
is not testable by design and leaves the Holm family. A grid that declares ``verdicts: {ablation: {pooled: true}}``
before training makes it one claim over every architecture's checkpoints instead (the same strata, each run weighing
as one): the retrieval heads carry retrieval in hybrids as a class, at the floor of all their runs together.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
from scipy import stats as st

from hybrid_lightning.analysis import stats, tables
from hybrid_lightning.analysis.arms import swa_hybrids
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.stats import ALPHA, MIN_SEEDS, Comparison, Decided, Test
from hybrid_lightning.analysis.verdict import Design, Models, Planned, Verdict, at_least, complete, stratified_floor

F = "2. retrieval heads"
NOT_TESTABLE = stats.BY_DESIGN  # the design cannot tell what the test asks


def where(runs: Runs) -> Test:
    c = runs.configs
    h = runs.heads[runs.heads["run"].isin(c[swa_hybrids(c)]["run"])]
    if h.empty:
        return Test(F, WHERE.name, verdict="not tested", evidence="no SWA hybrid has retrieval-head scores")
    last = h[h["step"] == h.groupby("run")["step"].transform("max")]
    reach = "reach_steps" in last and last["reach_steps"].notna().all()
    # runs some windowed head of which (one whose record holds a window) could reach a copy source
    windowed_reach = last["run"].isin(last.loc[last["window"].notna() & (last["reach_steps"] > 0), "run"]) if reach \
        else pd.Series(True, index=last.index)
    if reach:
        last = last[last["reach_steps"] > 0]
    windowed_reach = windowed_reach.reindex(last.index)
    retrieval = last["reach_retrieval" if reach else "retrieval"].astype(bool)
    # a head attends fully where its record holds no window: a full layer's, or a head-wise layer's full heads
    full = last["window"].isna()
    last = last.assign(retrieval=retrieval, full=full, window=last["run"].map(tables.windows(c)))
    per_run = pd.DataFrame({"heads": last["full"].groupby(last["run"]).mean(),
                            "retrieval": retrieval.groupby(last["run"]).sum(),
                            "retrieval_full": (retrieval & last["full"]).groupby(last["run"]).sum()})
    with_heads = per_run[per_run["retrieval"] > 0]
    among = "among the heads that could reach a copy source" if reach else "among all heads (no reachability recorded)"
    k, n = int(per_run["retrieval_full"].sum()), int(per_run["retrieval"].sum())
    evidence = (f"{n} retrieval heads at the last scoring of {len(per_run)} SWA hybrids {among}, {k} in "
                f"full-attention layers, in {len(with_heads)} runs")
    if with_heads.empty:
        return Test(F, WHERE.name, verdict="no signal", evidence=evidence)
    pooled = with_heads[with_heads.index.isin(last.loc[windowed_reach, "run"])]  # the unit is the run
    k_runs, n_runs = int((pooled["retrieval_full"] == pooled["retrieval"]).sum()), len(pooled)
    ci = st.binomtest(k_runs, n_runs).proportion_ci(stats.LEVEL, method="exact") if n_runs else None
    mine = last[last["run"].isin(with_heads.index)]
    # runs whose reachable heads are of both kinds
    mixed = with_heads[(with_heads["heads"] > 0) & (with_heads["heads"] < 1)]
    excess = mixed["retrieval_full"] / mixed["retrieval"] - mixed["heads"]
    head_p = stats.stratified_p([(g["full"].to_numpy(), g["retrieval"].to_numpy()) for _, g in mine.groupby("run")])
    heads = Comparison.paired("share of retrieval heads in full layers - share of heads there (head-level null)",
                              excess.to_numpy() if len(excess) else np.array([math.nan]), head_p, +1)
    depth, placements = _where_at_depth(mine)
    if math.isnan(depth.p):  # the test is not testable: its head-level claim leaves the Holm family with it
        heads.untestable = "attention type confounded with depth"
    runs_text = (f"{k_runs}/{n_runs} = {k_runs / n_runs:.2f} (exact 95% CI {ci.low:.2f} to {ci.high:.2f})" if ci else
                 "none")
    text = (f"; runs whose retrieval heads are all in full-attention layers, among the runs with retrieval heads whose "
            f"windowed heads could reach a copy source: {runs_text}; "
            f"{len(with_heads) - len(mixed)} of these runs have reachable heads of one kind only; full layers at "
            f"{placements}; per run: " + ", ".join(f"{run}: {r['retrieval_full']:.0f}/{r['retrieval']:.0f} vs "
                                                   f"{r['heads']:.2f}" for run, r in with_heads.iterrows()))
    return Test(F, WHERE.name, [heads, depth], evidence + text, combine=_where_verdict)


def _where_at_depth(last: pd.DataFrame) -> tuple[Comparison, str]:
    """The layer-level comparison: per run, the share of its retrieval heads in its full layers minus the mean
    share of the same layer indices in the runs of its window where they are reachable windowed layers (> 0:
    full attention holds more than the same depth does without it); p: the full marks moved within each
    (window, layer index) stratum. NaN where no stratum has both. Also the placements, in words."""
    layers = last.groupby(["run", "layer"]).agg(full=("full", "any"), retrieval=("retrieval", "sum"),
                                                window=("window", "first")).reset_index()
    layers["share"] = layers["retrieval"] / layers["run"].map(layers.groupby("run")["retrieval"].sum())
    strata = [g for _, g in layers.groupby(["window", "layer"], dropna=False)
              if g["full"].any() and not g["full"].all()]
    differences = []
    for _run, g in layers[layers["full"]].groupby("run"):
        terms = [row["share"] - s.loc[~s["full"], "share"].mean() for _, row in g.iterrows()
                 for s in strata if s["layer"].iloc[0] == row["layer"] and row["run"] in set(s["run"])]
        if terms:
            differences.append(sum(terms))
    placements = layers[layers["full"]].groupby("run")["layer"].agg(tuple).value_counts()
    text = ", ".join(f"layers {list(p)} in {n} runs" for p, n in placements.items())
    p = stats.stratified_p([(g["share"].to_numpy(), g["full"].to_numpy()) for g in strata]) if strata else math.nan
    comparison = Comparison.paired("full-layer share - share of the same layers where windowed, same window "
                                   "(layer-level null)", np.array(differences or [math.nan]), p, +1)
    return comparison, text


def _where_verdict(decided: list[Decided]) -> Decided:
    """Reproduced only where the head-level and the layer-level comparison are; refuted where either is
    refuted; not testable where no window has a full and a reachable windowed layer at one depth."""
    (heads, hv, hr), (depth, dv, dr) = decided
    if math.isnan(depth.p):
        return heads, NOT_TESTABLE, ("attention type confounded with depth: no window has a full-attention layer and a "
                                     "windowed layer that could reach a copy source at the same layer index (a "
                                     "placement such as FEEE beside EEEF, at a window that reaches the echo probes, "
                                     f"tells them apart); head level, outside the Holm family: raw p {heads.p:.3g}")
    if "refuted" in (hv, dv):
        return (heads, hv, hr) if hv == "refuted" else (depth, dv, dr)
    if hv == dv == "reproduced":
        return depth, "reproduced", ""
    return (depth, dv, dr) if dv != "reproduced" else (heads, hv, hr)


def _heads(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, _, b in (h.partition(".") for h in text.split())]


def _retrieval_marks(runs: Runs) -> tuple[dict, str]:
    """(run, step) -> the set of retrieval heads by the held-out selection report where recorded (score above
    the run's ``eval.heads.threshold``), else by the scored report; and which was used, in words."""
    thresholds = runs.configs.set_index("run")["eval.heads.threshold"]
    s = runs.selections
    marks = {key: set(zip(g.loc[g["score"] > thresholds[key[0]], "layer"],
                          g.loc[g["score"] > thresholds[key[0]], "head"]))
             for key, g in s.groupby(["run", "step"])}
    scored = {key: set(zip(g.loc[g["retrieval"].astype(bool), "layer"], g.loc[g["retrieval"].astype(bool), "head"]))
              for key, g in runs.heads.groupby(["run", "step"])}
    used = "the held-out selection report" if marks else "the scored report (no selection report recorded)"
    return {**scored, **marks}, used


def _experiment(top: set, draws: pd.DataFrame, per_layer: Counter, retrieval: set) -> tuple[dict, str]:
    """The distinct head sets of ``draws`` that are controls of the top-K ``top`` (see the module), each with the
    mean drop of its draws, or the reason there are none."""
    wanted = Counter(layer for layer, _ in top)
    if not per_layer:
        return {}, "no head scores at the checkpoint"
    if not top & retrieval:
        return {}, "no retrieval head in the top-K"
    full = [layer for layer, c in wanted.items() if c >= per_layer[layer]]
    if full:
        return {}, (f"the top-K fills layer {', '.join(map(str, sorted(full)))} "
                    f"({len(top)} of {per_layer[full[0]]} heads)")
    taken = Counter(layer for layer, _ in top | retrieval)
    short = [layer for layer, c in wanted.items() if per_layer[layer] - taken[layer] < c]
    if short:
        return {}, f"the other heads of layer {', '.join(map(str, sorted(short)))} are retrieval heads"
    valid = {}  # distinct head set -> the drops of its draws (a set drawn twice is one control)
    for text, drop in zip(draws["heads"], draws["token_drop"]):
        heads = _heads(text)
        if (Counter(layer for layer, _ in heads) == wanted and len(set(heads)) == len(top)
                and not set(heads) & (top | retrieval)):
            valid.setdefault(frozenset(heads), []).append(drop)
    return ({heads: float(np.mean(drops)) for heads, drops in valid.items()},
            "" if valid else "no control draw of non-retrieval heads of the top-K's layers")


def ablation(runs: Runs, pooled: bool = False) -> Test:
    """The ablation test: one claim per architecture, or (``pooled``) one over all of them."""
    a = tables.ablation(runs.ablations, runs.configs)
    if a.empty or "top" not in set(a["selection"]):
        return Test(F, ABLATION.name, verdict="not tested", evidence="no run has a top-K head ablation")
    a = a[a["within"]]  # within the training length, where retrieval can have formed
    draws = a.groupby(["run", "label", "step", "k", "selection", "seed", "draw", "heads"],
                      dropna=False)["token_drop"].mean().reset_index()
    marks, used = _retrieval_marks(runs)
    per_layer = {key: Counter(g) for key, g in runs.heads.groupby(["run", "step"])["layer"]}  # heads per layer
    strata, reasons = {}, {}
    for (run, label, step, k), g in draws.groupby(["run", "label", "step", "k"]):
        top = g[g["selection"] == "top"]
        if top.empty:
            continue
        others = g[g["selection"].isin(tables.DRAWS)]
        valid, why = _experiment(set(_heads(top["heads"].iloc[0])), others, per_layer.get((run, step), Counter()),
                                 marks.get((run, step), set()))
        if valid:
            strata.setdefault(label, {})[(run, step, k)] = (float(top["token_drop"].iloc[0]), valid, len(others))
        else:
            reasons.setdefault(label, []).append(why)
    return _ablation_test(strata, reasons, used, pooled)


def _ablation_test(strata: dict, reasons: dict, used: str, pooled: bool) -> Test:
    comparisons, lines = [], []
    if pooled and strata:
        every = {key: e for experiments in strata.values() for key, e in experiments.items()}
        comparisons.append(_per_architecture(f"{len(strata)} architectures pooled", every))
    for label, experiments in sorted(strata.items()):
        if not pooled:
            comparisons.append(_per_architecture(label, experiments))
        lines.append(f"{label}: " + ", ".join(
            f"{run} step {step}: {top:.3f} vs {np.mean(list(sets.values())):.3f} ({len(sets)} distinct control "
            f"set{'s' * (len(sets) > 1)} in {draws} draws)"
            for (run, step, _), (top, sets, draws) in experiments.items()))
    untestable = [f"{label}: " + "; ".join(f"{why} ({n} of {len(whys)} "
                                           "checkpoints)" for why, n in Counter(whys).items())
                  for label, whys in sorted(reasons.items()) if label not in strata]
    evidence = (f"retrieval heads by {used}; controls: same-layer non-retrieval heads outside the top-K. "
                + "; ".join(lines + [f"not testable: {u}" for u in untestable]))
    if comparisons:
        return Test(F, ABLATION.name, comparisons, evidence)
    if all(w == "no retrieval head in the top-K" for whys in reasons.values() for w in whys):
        return Test(F, ABLATION.name, verdict="no signal", evidence=evidence)
    return Test(F, ABLATION.name, verdict=NOT_TESTABLE, reason="; ".join(untestable), evidence=evidence)


def _per_architecture(label: str, experiments: dict) -> Comparison:
    """The claim of one architecture from its checkpoints ((run, step, K) -> (top-K drop, distinct control set ->
    its drop, draws)): per run the mean over its checkpoints of the top-K drop minus the mean drop of its
    distinct controls; p stratified by checkpoint, each run weighing as one; not testable where the distinct
    controls are too few for the exact p to fall below ``ALPHA``."""
    checkpoints = Counter(run for run, _, _ in experiments)
    per_run = pd.Series({key: top - np.mean(list(sets.values())) for key, (top, sets, _) in experiments.items()})
    d = per_run.groupby(level=0).mean()
    p = stats.stratified_p([(np.r_[top, list(sets.values())], np.r_[True, np.zeros(len(sets), bool)])
                            for top, sets, _ in experiments.values()],
                           [1 / checkpoints[run] for run, _, _ in experiments])
    ks = ", ".join(sorted({str(int(k)) for _, _, k in experiments}))
    c = Comparison.paired(f"{label}: top-K drop - drop of distinct same-layer non-retrieval head sets (K = {ks})",
                          d.to_numpy(), p, +1)
    counts = [len(sets) for _, sets, _ in experiments.values()]
    floor = stratified_floor([n + 1 for n in counts])
    if floor >= ALPHA:
        c.untestable = (f"{'/'.join(map(str, counts))} distinct same-layer control head sets at its "
                        f"{len(counts)} checkpoints: the exact p cannot fall below {floor:.2g}")
    return c


def _plan_where(d: Design, _: Models) -> list[Planned]:
    """Where: the head-level claim over runs whose reachable heads are of both kinds, the layer-level claim over
    (window, layer index) strata with a full layer that can copy and a reachable windowed layer."""
    labels = sorted(d.configs.loc[swa_hybrids(d.configs), "label"].unique())
    if not labels:
        return []
    heads = {label: int(d.value(label, "model.n_heads")) for label in labels}
    full = {label: d.plan(label).full_layers for label in labels}
    attention = {label: len(d.plan(label).layers) for label in labels}  # every layer of a windowed hybrid is attention
    mixed = [label for label in labels if d.reaches(label)]
    strata = {}  # (window, layer) -> (labels with the layer full, labels with it windowed)
    for label in mixed:
        for layer in range(attention[label]):
            key = (d.plan(label).window, layer)
            strata.setdefault(key, ([], []))[0 if layer in full[label] else 1].append(label)
    strata = {k: v for k, v in strata.items() if v[0] and v[1] and k[1] > 0}

    def floor(s: list[int]) -> list[float]:
        n = dict(zip(labels, s))
        runs = [(attention[label] * heads[label], len(full[label]) * heads[label])
                for label in mixed for _ in range(n[label])]
        enough = sum(n[label] for label in mixed) >= MIN_SEEDS
        head = stratified_floor([math.comb(h, m) for h, m in runs]) if enough else math.nan
        layer = [math.comb(sum(n[x] for x in a + b), sum(n[x] for x in a)) for a, b in strata.values()]
        enough = bool(layer) and sum(n[x] for a, _ in strata.values() for x in a) >= MIN_SEEDS
        return [head, stratified_floor(layer) if enough else math.nan]

    why = "" if strata else ("attention type confounded with depth: no window has a full layer that can copy "
                             "(layer > 0) and, at the same index in another placement, a windowed layer that reaches "
                             "a copy source")
    return [Planned(F, WHERE.name, "head level and layer level (full vs windowed layers of one depth and "
                    "window)", labels, d.seeds(labels), floor, complete(floor), "complete separation", why=why)]


def _control_sets(d: Design, label: str) -> int:
    """Distinct same-layer control head sets of the top-K of one layer of ``label``: at most C(heads - K, K)."""
    heads = int(d.value(label, "model.n_heads"))
    return min(d.controls, math.comb(heads - d.top_k, d.top_k)) if d.top_k < heads else 0


def _plan_pooled_ablation(d: Design, _: Models) -> list[Planned]:
    """The ablation as one claim over every architecture with full-attention heads and same-layer controls."""
    labels = [label for label in d.arms if d.plan(label).full_head_layers and _control_sets(d, label)]
    sets = [_control_sets(d, label) for label in labels]

    def floor(s: list[int]) -> list[float]:
        return at_least(s, [stratified_floor([n + 1 for n, seeds in zip(sets, s) for _ in range(seeds)])])

    why = "" if labels else "no architecture with full-attention heads has a same-layer control head set"
    return [Planned(F, ABLATION.named("pooled"), f"top-{d.top_k} heads vs their distinct same-layer non-retrieval "
                    f"head sets, one claim over {len(labels)} architectures", labels, d.seeds(labels), floor,
                    complete(floor), "complete separation", why=why)]


def _plan_ablation(d: Design, _: Models) -> list[Planned]:
    """Ablation per architecture with full-attention heads: the top-K, in one layer, against the distinct
    same-layer head sets of ``d.controls`` draws (at most C(heads - K, K), each counted once)."""
    out, k = [], d.top_k
    for label in d.arms:
        if not d.plan(label).full_head_layers:
            continue
        heads = int(d.value(label, "model.n_heads"))
        sets = _control_sets(d, label)

        def floor(s: list[int], sets: int = sets) -> list[float]:
            return at_least(s, [stratified_floor([sets + 1] * s[0]) if sets else math.nan])

        why = "" if k < heads else (f"the top-K (K={k}) fills a layer of {heads} heads wherever it lies in one: no "
                                    "same-layer control; testable only where it spans layers")
        seeds = d.seeds([label])[0]
        if sets and seeds >= MIN_SEEDS and stratified_floor([sets + 1] * seeds) >= ALPHA:
            why = (f"a layer of {heads} heads with the top-{k} in it leaves {sets} distinct same-layer control head "
                   f"set{'s' * (sets > 1)}: at {seeds} seeds the exact p cannot fall below "
                   f"{stratified_floor([sets + 1] * seeds):.2g}")
        out.append(Planned(F, ABLATION.named(label), f"top-{k} heads vs their {sets} distinct same-layer "
                           "non-retrieval head sets", [label], d.seeds([label]), floor, complete(floor),
                           "complete separation", why=why))
    return out


def _declared_ablation(declared: dict) -> Verdict:
    """The ablation under a grid's declarations (``ablation: {pooled}``): one claim per architecture by default."""
    if not (declared.get("ablation") or {}).get("pooled"):
        return ABLATION
    return Verdict(F, ABLATION.name, lambda runs: [ablation(runs, pooled=True)], _plan_pooled_ablation,
                   declare=_declared_ablation)


WHERE = Verdict(F, "where", lambda runs: [where(runs)], _plan_where)
ABLATION = Verdict(F, "ablation", lambda runs: [ablation(runs)], _plan_ablation, declare=_declared_ablation)
