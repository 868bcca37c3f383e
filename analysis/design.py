"""The design check (``hybrid-lightning grid plan GRID --verdicts``): before anything trains, which verdicts of
``analyze --findings`` a grid can reach. From the cells' plans it groups the arms as analysis will (one
architecture, one arm; analysis/arms.py), and per test of analysis/findings.py it states what the test
compares, whether the design lets it reach a verdict at all (and why not), the smallest p its exact null
distribution allows at these seeds (the floor: complete separation), that floor after Holm's adjustment over
the finding's claims (every claim at its floor: Holm is monotone, so no data give less), the power at these
seeds and the seeds per arm that reach 80% power (analysis/power.py) at a stated effect, or at the effect and
variance of pilot runs (``--pilot RUNS``, analysis/pilot.py). Power is taken at alpha / m, m the finding's
claims (Holm's first step), so a claim reaches that power whatever the others do.

Default effects (``DEFAULT_EFFECT`` seed standard deviations): two arms' means apart by 1.5 seed SDs (speed,
NoPE beyond and cost, the convergence gap); censored times (speed, laziness) normal with SD 0.15 of the
budget, the earliest arm at 0.4 of it and each other arm (each larger window) 1.5 SDs later, observed at the
evaluations (head scorings) and censored at the end; convergence's equivalence with the arms equal at the end
and seeds spread by half the margin. *Where* and *ablation* depend on where heads form, which no default
can say: their power is that of complete separation (every retrieval head in a full layer; the top-K more
harmful than every control), 1 where the floor is below alpha / m, else 0. It also warns about controls that
cannot do their job (``warnings``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import power as pw
from hybrid_lightning.analysis.arms import families, nope_pairs, swa_hybrids
from hybrid_lightning.analysis.emergence import EQUIVALENCE_MARGIN, declared_steps
from hybrid_lightning.analysis.laziness import window_families
from hybrid_lightning.analysis.load import find_runs, load_runs, planned_configs
from hybrid_lightning.analysis.pilot import DEFAULT_EFFECT, default_models, pilot_models
from hybrid_lightning.analysis.stats import ALPHA, EXACT_LIMIT, MIN_SEEDS, PERMUTATIONS, holm, min_p
from hybrid_lightning.runplan import RunPlan
from hybrid_lightning.units import format_table

TOP_K, CONTROLS = 2, 20  # the ablation the replica runs (heads --mask-top 2 --controls 20); a pilot's own K where it has one
MC_FLOOR = 2 / (PERMUTATIONS + 1)  # a two-sided Monte-Carlo p cannot fall below this

Floor = Callable[[list[int]], list[float]]  # seeds per arm -> the smallest p of each claim (NaN: cannot be made)


@dataclass
class Planned:
    """One test of the design: ``labels`` its arms, ``seeds`` theirs as the grid has them, ``floor`` per claim,
    ``needs``: ``all`` of its claims for reproduced (``any``: one of them), ``simulate`` its power, ``effect``
    the model of it, ``why`` what stops it (empty: reachable), ``adjusted``/``power`` filled by ``plan_tests``."""

    finding: str
    test: str
    compares: str
    labels: list[str]
    seeds: list[int]
    floor: Floor
    simulate: pw.Simulate | None = None
    effect: str = ""
    needs: str = "all"
    why: str = ""
    adjusted: float = math.nan
    power: float = math.nan
    needed: int | None = None


def two_arms(n: int, m: int) -> float:
    """Floor of the two-sided permutation p of two arms (exact up to ``EXACT_LIMIT`` relabellings)."""
    return min_p(n, m) if math.comb(n + m, n) <= EXACT_LIMIT else MC_FLOOR


def arms_floor(sizes: list[int]) -> float:
    """Floor of ``stats.Comparison.among``: two arms two-sided; more, the spread's upper tail, which complete
    separation reaches only by relabellings that swap arms of equal size."""
    if len(sizes) == 2:
        return two_arms(*sizes)
    total = math.factorial(sum(sizes)) // math.prod(math.factorial(s) for s in sizes)
    same = math.prod(math.factorial(sizes.count(s)) for s in set(sizes))
    return same / total if total <= EXACT_LIMIT else 1 / (PERMUTATIONS + 1)


def stratified_floor(combinations: list[int]) -> float:
    """Floor of ``stats.stratified_p`` with strata of these many placements of their marks."""
    total = math.prod(combinations)
    return min(1.0, 2 / total) if total <= EXACT_LIMIT else MC_FLOOR


def at_least(seeds: list[int], floors: list[float]) -> list[float]:
    """``floors``, NaN where an arm has fewer than ``MIN_SEEDS`` seeds (no verdict then)."""
    return floors if min(seeds) >= MIN_SEEDS else [math.nan] * len(floors)


@dataclass(frozen=True)
class Design:
    """What the checks read: ``configs`` (``load.planned_configs``), ``plans`` by run, and per label its runs."""

    configs: pd.DataFrame
    plans: dict[str, RunPlan]

    @property
    def arms(self) -> dict[str, list[str]]:
        return {label: sorted(g["run"]) for label, g in self.configs.groupby("label", sort=True)}

    def seeds(self, labels: list[str]) -> list[int]:
        return [len(self.arms[label]) for label in labels]

    def value(self, label: str, key: str):
        return self.configs.loc[self.configs["label"] == label, key].iloc[0]

    def plan(self, label: str) -> RunPlan:
        return self.plans[self.arms[label][0]]

    def steps(self, label: str, section: str) -> np.ndarray:
        """The evaluation (``eval``) or head-scoring (``eval.heads``) steps of an arm, as shares of its budget."""
        total = self.plan(label).budget.max_steps
        every, at_end = self.value(label, f"{section}.every_n_steps"), self.value(label, f"{section}.at_end")
        steps = list(range(every, total + 1, every)) if every else []
        steps += [total] if at_end and total not in steps else []
        return np.array(sorted(steps), float) / total

    def nearest(self, label: str) -> int | None:
        """Tokens back to the nearest copy source of the head probes (the plan's), None where not recorded."""
        return ((self.plan(label).probes or {}).get("heads") or {}).get("nearest_source")

    def reaches(self, label: str) -> bool:
        """Whether the arm's windowed heads can reach a copy source of the head probes."""
        window, nearest = self.plan(label).window, self.nearest(label)
        return window is None or nearest is None or window - 1 >= nearest


def speed_tests(d: Design, models: Callable) -> list[Planned]:
    """Speed and convergence per family of hybrids that differ only in their efficient layers."""
    out, fams = [], families(d.configs)
    for fam in fams:
        labels, name = list(fam.labels), ("" if len(fams) == 1 else f": {fam.name}")
        steps = d.steps(labels[0], "eval")
        sim = models("speed", labels, steps)
        out.append(Planned("1. emergence speed", f"speed (probes){name}", f"{len(labels)} arms: " + ", ".join(labels), labels,
                           d.seeds(labels), lambda s: at_least(s, [arms_floor(s)]), sim[1], sim[0]))
        declared = declared_steps(list(steps))
        conv = models("convergence", labels, steps)
        out.append(Planned("1. emergence speed", f"convergence (probes){name}", "gap at the declared mid evaluation, "
                           f"equivalence within ±{EQUIVALENCE_MARGIN:g} at the end, apart at the end", labels, d.seeds(labels),
                           lambda s, ok=bool(declared): at_least(s, [arms_floor(s), 0.0, arms_floor(s)] if ok else [math.nan] * 3),
                           conv[1], conv[0],
                           why="" if declared else "fewer than three evaluations at the declared shares 0.5, 0.75, 1 of the budget"))
        out[-1].needs = "first two"
    return out


def nope_tests(d: Design, models: Callable) -> list[Planned]:
    out = []
    for pair in nope_pairs(d.configs):
        labels = [pair["rope"], pair["nope"]]
        for test, what in (("beyond", "NoPE - RoPE of (score beyond - score within)"),
                           ("cost", "NoPE - RoPE val/text_loss - 0.02 nats")):
            sim = models(test, labels, None)
            out.append(Planned("3. NoPE on full layers", f"{test}: {pair['rope']}", what, labels, d.seeds(labels),
                               lambda s: at_least(s, [two_arms(*s)]), sim[1], sim[0]))
    return out


def laziness_tests_planned(d: Design, models: Callable) -> list[Planned]:
    _, fams = window_families(d.configs)
    out = []
    for g in fams:
        labels = sorted(g["label"].unique(), key=lambda label: d.plan(label).window)
        windows = [d.plan(label).window for label in labels]
        name = "laziness" if len(fams) == 1 else f"laziness: {g['label'].iloc[0]}"
        sim = models("laziness", labels, d.steps(labels[0], "eval.heads"))
        out.append(Planned("2. retrieval heads", name, "log-rank of adjacent windows " + ", ".join(
            f"W={b} vs W={a}" for a, b in zip(windows, windows[1:])), labels, d.seeds(labels),
            lambda s: at_least(s, [two_arms(a, b) for a, b in zip(s, s[1:])]), sim[1], sim[0], needs="any"))
    return out


def where_test(d: Design) -> list[Planned]:
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
        runs = [(attention[label] * heads[label], len(full[label]) * heads[label]) for label in mixed for _ in range(n[label])]
        head = stratified_floor([math.comb(h, m) for h, m in runs]) if sum(n[label] for label in mixed) >= MIN_SEEDS else math.nan
        layer = [math.comb(sum(n[x] for x in a + b), sum(n[x] for x in a)) for a, b in strata.values()]
        return [head, stratified_floor(layer) if layer and sum(n[x] for a, _ in strata.values() for x in a) >= MIN_SEEDS else math.nan]

    why = "" if strata else ("attention type confounded with depth: no window has a full layer that can copy (layer "
                             "> 0) and, at the same index in another placement, a windowed layer that reaches a copy source")
    return [Planned("2. retrieval heads", "where", "head level and layer level (full vs windowed layers of one depth and "
                    "window)", labels, d.seeds(labels), floor, _complete(floor), "complete separation", why=why)]


def ablation_tests(d: Design, k: int, controls: int) -> list[Planned]:
    """Ablation per architecture with full-attention heads: the top-K against ``controls`` same-layer draws."""
    out = []
    for label in d.arms:
        if not d.plan(label).full_layers:
            continue
        heads = int(d.value(label, "model.n_heads"))

        def floor(s: list[int], ok: bool = k < heads) -> list[float]:
            return at_least(s, [stratified_floor([controls + 1] * s[0]) if ok else math.nan])

        why = "" if k < heads else (f"the top-K (K={k}) fills a layer of {heads} heads wherever it lies in one: no "
                                    "same-layer control; testable only where it spans layers")
        out.append(Planned("2. retrieval heads", f"ablation: {label}", f"top-{k} heads vs {controls} same-layer "
                           "non-retrieval draws", [label], d.seeds([label]), floor, _complete(floor), "complete separation",
                           why=why))
    return out


def _complete(floor: Floor) -> pw.Simulate:
    """Power at complete separation: 1 where every claim's floor is below alpha, else 0."""
    return lambda s, alpha: float(all(f < alpha for f in floor(s)))


def warnings(d: Design, k: int) -> list[str]:
    """Controls that cannot do their job: a hybrid whose only full layers sit where no head can copy (layer 0:
    its keys hold no previous-token information), windows that no head-probe copy source lies inside, a top-K
    as large as a layer."""
    out = []
    for label in d.arms:
        plan = d.plan(label)
        if plan.mixers and plan.full_layers == (0,):
            out.append(f"{label}: its only full-attention layer is layer 0, whose keys hold no previous-token "
                       "information: no head there can copy, so as a depth control it cannot retrieve at all")
        if plan.windowed_hybrid and not d.reaches(label):
            out.append(f"{label}: no windowed head can reach a copy source of the head probes (the nearest lies "
                       f"{d.nearest(label)} tokens back; a window needs {d.nearest(label) + 1} or more)")
        heads = int(d.value(label, "model.n_heads"))
        if plan.full_layers and k >= heads:
            out.append(f"{label}: top-K {k} >= {heads} heads per layer: a top-K inside one layer is the whole layer")
    return list(dict.fromkeys(out))


def plan_tests(tests: list[Planned]) -> list[Planned]:
    """Fills each test's Holm-adjusted floor, its power at its seeds and the seeds for 80% power."""
    for finding in dict.fromkeys(t.finding for t in tests):  # claims the analysis computes count, reachable or not
        floors = [(t, f) for t in tests if t.finding == finding for f in t.floor(t.seeds)]
        m = sum(not math.isnan(f) for _, f in floors)
        adjusted = holm([f for _, f in floors])
        for t in [t for t in tests if t.finding == finding and not t.why]:
            own = [a for (u, _), a in zip(floors, adjusted) if u is t]
            chosen = own[:2] if t.needs == "first two" else own
            reached = min((a for a in chosen if not math.isnan(a)), default=math.nan)  # all NaN: none, no warning
            t.adjusted = float(reached if t.needs == "any" else np.max(chosen)) if own else math.nan
            if t.simulate is not None and m:
                t.power = t.simulate(t.seeds, ALPHA / m) if not math.isnan(t.adjusted) else 0.0
                t.needed = pw.seeds_for(lambda n, t=t: t.simulate([n] * len(t.labels), ALPHA / m))
    return tests


def row(t: Planned) -> dict:
    """A test of the design as the report shows it (``--json``: these dicts)."""
    floors = [f for f in t.floor(t.seeds) if not math.isnan(f)]
    reach = "no" if t.why or math.isnan(t.adjusted) else ("yes" if t.adjusted < ALPHA else "no (floor)")
    return {"finding": t.finding, "test": t.test, "compares": t.compares, "seeds": "/".join(map(str, t.seeds)),
            "reachable": reach, "why": t.why, "floor": min(floors) if floors else None,
            "holm_floor": None if math.isnan(t.adjusted) else t.adjusted,
            "power": None if math.isnan(t.power) else t.power, "seeds_for_80": t.needed, "effect": t.effect}


def report(rows: list[dict], warned: list[str], source: str) -> str:
    def num(v, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    table = [["finding", "test", "seeds", "reachable", "floor p", "Holm floor", "power", "seeds for 80%", "effect"]]
    table += [[r["finding"].split(".")[0], r["test"], r["seeds"], r["reachable"], num(r["floor"], ".3g"),
               num(r["holm_floor"], ".3g"), num(r["power"], ".2f"), num(r["seeds_for_80"], "d"), r["effect"]] for r in rows]
    lines = [format_table(table, left=(1, 8)), "", f"Effects: {source}. Holm floor: every claim of the finding at its "
             f"floor; reachable: Holm floor < {ALPHA}; power by simulation at alpha / (claims of the finding)."]
    lines += [f"- {r['test']}: compares {r['compares']}" + (f"; not reachable: {r['why']}" if r["why"] else "") for r in rows]
    lines += ["", "Warnings:" if warned else "Warnings: none."] + [f"- {w}" for w in warned]
    return "\n".join(lines)


def design_check(cells: list[tuple[str, dict, RunPlan]], pilot: str | Path | None = None, as_json: bool = False) -> str:
    """The design check's report for a grid's cells (name, config as plain data, plan), with effects from the
    pilot run directories under ``pilot`` where given; ``as_json``: the tests (``row``) and warnings as JSON."""
    configs = planned_configs(cells)
    d = Design(configs, {name: plan for name, _, plan in cells})
    models, k, source = default_models, TOP_K, (f"default ({DEFAULT_EFFECT:g} seed SDs and the models above); "
                                                  f"ablation K={TOP_K} with {CONTROLS} control draws")
    if pilot is not None:
        dirs = find_runs(pilot) if Path(pilot).is_dir() else []
        if not dirs:
            raise ValueError(f"--pilot: no run directory (a folder with config.yaml) under {pilot}")
        runs = load_runs(dirs, root=pilot)
        ks = runs.ablations.loc[runs.ablations["selection"].eq("top"), "k"].dropna() if len(runs.ablations) else []
        k = int(ks.mode().iloc[0]) if len(ks) else TOP_K
        models, source = pilot_models(runs, configs), f"from the {len(runs.configs)} pilot runs in {pilot}; ablation K={k}"
    tests = speed_tests(d, models) + where_test(d) + ablation_tests(d, k, CONTROLS) + laziness_tests_planned(d, models)
    rows, warned = [row(t) for t in plan_tests(tests + nope_tests(d, models))], warnings(d, k)
    return json.dumps({"tests": rows, "warnings": warned, "effects": source}, indent=1) if as_json else report(rows, warned, source)
