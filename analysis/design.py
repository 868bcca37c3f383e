"""The design check (``hybrid-lightning grid plan GRID --verdicts``): before anything trains, which verdicts of
``analyze --findings`` a grid can reach. From the cells' plans it groups the arms as analysis will (one
architecture, one arm; analysis/arms.py), and per test of analysis/findings.py it states what the test
compares, whether the design lets it reach a verdict at all (and why not), the smallest p its exact null
distribution allows at these seeds (the floor: complete separation), that floor after Holm's adjustment over
the finding's claims (every claim at its floor: Holm is monotone, so no data give less), the power at these
seeds and the seeds per arm that reach 80% power (analysis/power.py) at a stated effect, or at the effect and
variance of pilot runs (``--pilot RUNS``, analysis/pilot.py). A claim that cannot pass by design (a reason in
``why``, or too few seeds) leaves the finding's family, as in the verdicts. Power is taken with Holm's
step-down as the verdicts apply it (``step_down_level``): the other claims at their floors, those that can
pass rejected first.

The tests are those of the verdicts registered in analysis/registry.py, each planned by its own ``plan``
(``verdict.Verdict``); what follows is what the built-in ones assume.

Default effects (``power.DEFAULT_EFFECT`` seed standard deviations): two arms' means apart by 1.5 seed SDs (speed,
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
from pathlib import Path

import numpy as np

from hybrid_lightning.analysis import mechanism, registry
from hybrid_lightning.analysis import power as pw
from hybrid_lightning.analysis.load import find_runs, load_runs, planned_configs
from hybrid_lightning.analysis.pilot import default_models, pilot_models
from hybrid_lightning.analysis.stats import ALPHA, holm
from hybrid_lightning.analysis.verdict import CONTROLS, TOP_K, Design, Planned
from hybrid_lightning.runplan import RunPlan
from hybrid_lightning.units import format_table


def warnings(d: Design) -> list[str]:
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
        if plan.full_layers and d.top_k >= heads:
            out.append(f"{label}: top-K {d.top_k} >= {heads} heads per layer: "
                       "a top-K inside one layer is the whole layer")
    return list(dict.fromkeys(out))


def plan_tests(tests: list[Planned]) -> list[Planned]:
    """Fills each test's Holm-adjusted floor, its power at its seeds and the seeds for 80% power."""
    for finding in dict.fromkeys(t.finding for t in tests):  # a claim that cannot pass by design leaves the family
        floors = [(t, f if not t.why else math.nan) for t in tests if t.finding == finding for f in t.floor(t.seeds)]
        adjusted = holm([f for _, f in floors])
        for t in [t for t in tests if t.finding == finding and not t.why]:
            own = [a for (u, _), a in zip(floors, adjusted) if u is t]
            chosen = own[:2] if t.needs == "first two" else own
            reached = min((a for a in chosen if not math.isnan(a)), default=math.nan)  # all NaN: none, no warning
            t.adjusted = float(reached if t.needs == "any" else np.max(chosen)) if own else math.nan
            if t.simulate is not None:
                level = step_down_level(t, floors, adjusted)
                t.power = t.simulate(t.seeds, level) if not math.isnan(t.adjusted) else 0.0
                t.needed = pw.seeds_for(lambda n, t=t, level=level: t.simulate([n] * len(t.labels), level))
    return tests


def step_down_level(t: Planned, floors: list[tuple[Planned, float]], adjusted: list[float]) -> float:
    """The level at which ``t``'s smallest p is judged by Holm's step-down procedure as the verdicts apply it,
    with every other claim of the finding at its floor: those that pass there are rejected first, so the
    claim faces ALPHA over its test's claims and the others' claims that cannot pass (Holm floor >= ALPHA)."""
    own = sum(not math.isnan(f) for u, f in floors if u is t)
    stuck = sum(not a < ALPHA for (u, f), a in zip(floors, adjusted) if u is not t and not math.isnan(f))
    return ALPHA / max(1, own + stuck)


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
               num(r["holm_floor"], ".3g"), num(r["power"], ".2f"), num(r["seeds_for_80"], "d"), r["effect"]]
              for r in rows]
    lines = [format_table(table, left=(1, 8)), "", f"Effects: {source}. Holm floor: every claim of the finding at its "
             f"floor; reachable: Holm floor < {ALPHA}; power by simulation with Holm's step-down, the other claims "
             "at their floors."]
    lines += [f"- {r['test']}: compares {r['compares']}" + (f"; not reachable: {r['why']}" if r["why"] else "")
              for r in rows]
    lines += ["", "Warnings:" if warned else "Warnings: none."] + [f"- {w}" for w in warned]
    return "\n".join(lines)


def design_check(cells: list[tuple[str, dict, RunPlan]], pilot: str | Path | None = None, as_json: bool = False,
                 declared: dict | None = None) -> str:
    """The design check's report for a grid's cells (name, config as plain data, plan), with effects from the
    pilot run directories under ``pilot`` where given; ``as_json``: the tests (``row``) and warnings as JSON.
    The tests are those of the registered verdicts that have a design check (analysis/registry.py), under what
    the grid ``declared`` for them (``registry.verdicts``); the warnings, where it decides a test of finding 2."""
    configs = planned_configs(cells)
    models, k, source = default_models, TOP_K, (f"default ({pw.DEFAULT_EFFECT:g} seed SDs and the models above); "
                                                  f"ablation K={TOP_K} with {CONTROLS} control draws")
    if pilot is not None:
        dirs = find_runs(pilot) if Path(pilot).is_dir() else []
        if not dirs:
            raise ValueError(f"--pilot: no run directory (a folder with config.yaml) under {pilot}")
        runs = load_runs(dirs, root=pilot)
        ks = runs.ablations.loc[runs.ablations["selection"].eq("top"), "k"].dropna() if len(runs.ablations) else []
        k = int(ks.mode().iloc[0]) if len(ks) else TOP_K
        models = pilot_models(runs, configs)
        source = f"from the {len(runs.configs)} pilot runs in {pilot}; ablation K={k}"
    d = Design(configs, {name: plan for name, _, plan in cells}, k, CONTROLS)
    chosen = registry.verdicts(declared)
    tests = [t for verdict in chosen if verdict.plan is not None for t in verdict.plan(d, models)]
    heads = any(v.finding == mechanism.WHERE.finding for v in chosen)  # the warnings are of finding 2's controls
    rows, warned = [row(t) for t in plan_tests(tests)], warnings(d) if heads else []
    if as_json:
        return json.dumps({"tests": rows, "warnings": warned, "effects": source}, indent=1)
    return report(rows, warned, source)
