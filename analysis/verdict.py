"""What a verdict of ``analyze --findings`` is: one object (``Verdict``) per test, defined in one module (the
built-in ones in analysis/emergence.py, convergence.py, mechanism.py, diagnostic_verdicts.py, laziness.py, nope.py,
scaling_runs.py) and registered once, by one line, in analysis/registry.py; ``findings`` (the verdicts), the design
check (``grid plan --verdicts``, analysis/design.py) and the pilot's effect models (analysis/pilot.py) iterate over
the registry. Also what the design check of a verdict works with: the grid's arms and plans (``Design``), a test as
planned (``Planned``) and the floors of the permutation tests' exact null distributions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import power as pw
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.permutation import EXACT_LIMIT, PERMUTATIONS
from hybrid_lightning.analysis.stats import MIN_SEEDS, Test, min_p
from hybrid_lightning.runplan import RunPlan

TOP_K, CONTROLS = 2, 20  # the replica's ablation (heads --mask-top 2 --controls 20); a pilot's own K where it has one
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


def complete(floor: Floor) -> pw.Simulate:
    """Power at complete separation: 1 where every claim's floor is below alpha, else 0."""
    return lambda s, alpha: float(all(f < alpha for f in floor(s)))


@dataclass(frozen=True)
class Design:
    """What the checks read: ``configs`` (``load.planned_configs``), ``plans`` by run, and per label its runs."""

    configs: pd.DataFrame
    plans: dict[str, RunPlan]
    top_k: int = TOP_K  # the ablation's K (a pilot's own where it has one) and its control draws
    controls: int = CONTROLS

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

    def untimed(self, label: str, section: str) -> str:
        """Why an arm's evaluations (``eval`` or ``eval.heads``) cannot time an event, or "" where they can: a test
        of when something happens needs one before the end."""
        if len(self.steps(label, section)) >= 2:
            return ""
        return (f"{label} is evaluated ({section}) at its end only, if at all ({section}.every_n_steps 0): no time of "
                "emergence to observe")

    def nearest(self, label: str) -> int | None:
        """Tokens back to the nearest copy source of the head probes (the plan's), None where not recorded."""
        return ((self.plan(label).probes or {}).get("heads") or {}).get("nearest_source")

    def reaches(self, label: str) -> bool:
        """Whether the arm's windowed heads can reach a copy source of the head probes."""
        window, nearest = self.plan(label).window, self.nearest(label)
        return window is None or nearest is None or window - 1 >= nearest


# (verdict, its arms' labels, evaluation steps as shares of the budget or None) -> (the effect in words, power)
Models = Callable[["Verdict", list[str], "np.ndarray | None"], tuple[str, pw.Simulate]]


@dataclass(frozen=True)
class Verdict:
    """One test of a finding, everything about it in one object.

    finding: the finding it belongs to (``1. emergence speed``): its claims form one Holm family.
    name: the test's name in ``findings.csv`` (a test per family of arms is ``name: family``, ``named``).
    decide: the runs (``load.Runs``) -> its tests (``stats.Test``, each with its comparisons and evidence).
    plan: its design check, (``Design``, ``Models``) -> the tests as planned (``Planned``: what it compares, the
        floor of each claim's p, its power); None: ``grid plan --verdicts`` does not list it.
    default: its default effect model, (labels, steps) -> ``power.Model`` (the ``default_models`` of
        analysis/pilot.py); None where ``plan`` states its own power.
    passes: its verdict rule on simulated experiments, (arms as the model draws them, alpha) -> (REPLICATIONS,)
        bool.
    samples: what it reads from a pilot, (pilot runs, run names per arm) -> per arm the values its ``default``
        model draws (None where a run lacks them); ``resample``: those values -> the model drawing from them.
    declare: the verdict under what a grid declares for its verdicts (plain data:
        ``grid.schema.VerdictsSpec.declared``); None: it reads no declaration.
    """

    finding: str
    name: str
    decide: Callable[[Runs], list[Test]]
    plan: Callable[[Design, Models], list[Planned]] | None = None
    default: Callable[[list[str], np.ndarray | None], pw.Model] | None = None
    passes: Callable[[list, float], np.ndarray] | None = None
    samples: Callable[[Runs, list[list[str]]], list | None] | None = None
    resample: Callable[[list, str], pw.Model] = pw.resampled
    declare: Callable[[dict], Verdict] | None = None

    def named(self, family: str = "") -> str:
        """The test's name, for one family of arms among several (``family`` not empty) ``name: family``."""
        return f"{self.name}: {family}" if family else self.name
