"""Finding 1, convergence (analysis/findings.py): whether the hybrids of a family (analysis/arms.py) draw
together by the end of the budget, on a measure and within a margin the grid declares before the results are
seen (its ``verdicts.convergence``: ``grid.schema.ConvergenceSpec``; ``Convergence.declared``).

The test uses evaluations declared before looking: ``mid``, the last common evaluation at or before
``CONVERGENCE_STEPS[0]`` of the last one (``end``), and ``late`` at ``CONVERGENCE_STEPS[1]``, and a measure
that is not at its ceiling where the arms have risen: by default ``SCORE_BEYOND``, the score beyond the training
length (within it every risen arm ends near 1 - chance, so equivalence there would be automatic), or the answer
loss's gain over chance (``loss_gain``, within or beyond the training length). It is judged only among arms that
have risen: every arm must be above its level (on the within score, as for speed: analysis/emergence.py) in
most of its seeds by ``late``; an arm that has not (still rising, or never risen) makes it ``not testable at
this budget``, naming the arm, never refuted. Claims: the arms differ at ``mid`` (a gap to close); they are
equivalent at ``end`` within the margin (two one-sided Welch tests per pair, ``stats.tost``, its 90% interval;
with more than two arms every pair must be, so the p is the largest pair's); they differ at ``end``. Context:
the change of each run from ``late`` to ``end``, compared among the arms (do they still move relative to each
other?). ``reproduced``: a gap at ``mid`` and equivalence at ``end``; ``not testable at this budget``: an arm
not risen, or the arms still moving relative to each other (raw p < 0.05); ``refuted``: apart at ``end``,
equivalence rejected (the least equivalent pair's 90% interval wholly outside the margin) and the gap not
shrinking from ``late`` to ``end`` (the arm means' spread no smaller); otherwise inconclusive with the reason.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import power as pw
from hybrid_lightning.analysis import stats
from hybrid_lightning.analysis.arms import Family, families
from hybrid_lightning.analysis.emergence import NOT_TESTABLE, SIGNAL_Z, F, per_family
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.metrics import METRICS, SCORE_BEYOND
from hybrid_lightning.analysis.stats import ALPHA, Comparison, Decided, Test
from hybrid_lightning.analysis.verdict import Design, Models, Planned, Verdict, arms_floor, at_least
from hybrid_lightning.config.fields import CONVERGENCE_MEASURES

CONVERGENCE_STEPS = (0.5, 0.75)  # mid and late: shares of the last common evaluation's step, declared before looking
EQUIVALENCE_MARGIN = CONVERGENCE_MEASURES["score_beyond"]  # the default measure's: arms this close are equal
NAME = "convergence (probes)"


def declared_steps(steps: list) -> tuple | None:
    """(mid, late, end) of ``CONVERGENCE_STEPS`` among the common evaluation ``steps``; None without three distinct."""
    end = steps[-1]
    mid, late = ([s for s in steps if s <= share * end] for share in CONVERGENCE_STEPS)
    if not mid or not late or not mid[-1] < late[-1] < end:
        return None
    return mid[-1], late[-1], end


@dataclass(frozen=True)
class Convergence:
    """The convergence test on ``measure`` (a tidy metric: ``longctx/<score>[_beyond]``) within ``margin`` (its
    units); ``verdict()`` is it as a registered verdict."""

    measure: str = SCORE_BEYOND
    margin: float = EQUIVALENCE_MARGIN

    @staticmethod
    def declared(declared: dict) -> Verdict:
        """The verdict under a grid's declarations (``grid.schema.VerdictsSpec.declared``: ``convergence``, its
        ``measure`` by score name, e.g. ``loss_gain_beyond``, and ``margin``); the defaults where it declares none."""
        spec = declared.get("convergence")
        if spec is None:
            return CONVERGENCE
        score, beyond = spec["measure"].removesuffix("_beyond"), spec["measure"].endswith("_beyond")
        return Convergence(METRICS[score] + ("_beyond" if beyond else ""), float(spec["margin"])).verdict()

    def verdict(self) -> Verdict:
        return Verdict(F, NAME, self.tests, self.plan, self.default, self.passes, self.samples, _resample,
                       declare=Convergence.declared)

    def tests(self, runs: Runs) -> list[Test]:
        """The convergence test of ``measure`` per family whose runs logged the probe score."""
        m = runs.metrics
        measure = m[m["metric"] == self.measure].pivot_table(index="run", columns="step", values="value")

        def judge(name, fam, values, _, level, __):
            return self._judge(name, fam, values, level, measure)
        return per_family(runs, self.verdict(), judge, missing=False)

    def _judge(self, test: str, fam: Family, values: pd.DataFrame, level: pd.Series, measure: pd.DataFrame) -> Test:
        runs = [r for r in values.index if r in set(measure.index)]
        common = measure.reindex(runs).dropna(axis=1) if runs else measure.iloc[:0, :0]
        steps = declared_steps(list(common.columns)) if common.shape[1] else None
        if steps is None:
            return Test(F, test, verdict="not tested", evidence=f"fewer than three common evaluations of "
                        f"{self.measure} in family {fam.name} at distinct shares {CONVERGENCE_STEPS} and 1 of the "
                        "last")
        mid, late, end = steps
        at = {s: {label: common[s].reindex(r).dropna().to_numpy(float) for label, r in fam.runs.items()}
              for s in steps}
        risen = {label: int(values.reindex(index=r, columns=[late])[late].ge(level.reindex(r)).sum())
                 for label, r in fam.runs.items()}
        means = ", ".join(f"{label}: " + " / ".join(f"{at[s][label].mean():.3f}" for s in steps)
                          + f" (risen in {risen[label]}/{len(fam.runs[label])} by step {late})" for label in fam.labels)
        evidence = (f"family {fam.name}: {self.measure} arm means at the declared steps {mid} / {late} / {end}: "
                    + means)
        late_arms = [f"{label} ({risen[label]}/{len(r)} seeds)" for label, r in fam.runs.items()
                     if not 2 * risen[label] > len(r)]
        if late_arms:
            return Test(F, test, verdict=NOT_TESTABLE, reason=f"{', '.join(late_arms)} not above {SIGNAL_Z:g} null "
                        f"standard errors in most seeds by the declared step {late}: convergence is judged only among "
                        "arms that have risen", evidence=evidence)
        gap = Comparison.among(f"arms at step {mid} (the declared gap)", at[mid])
        equivalent = self._equivalence(at[end], end)
        moving = Comparison.among(f"change from step {late} to {end}",
                                  {k: at[end][k] - at[late][k] for k in fam.labels})
        moving.claim = False
        apart = Comparison.among(f"arms at step {end}", at[end])
        shrinking = np.std([v.mean() for v in at[end].values()]) < np.std([v.mean() for v in at[late].values()])
        return Test(F, test, [gap, equivalent, moving, apart], evidence, decide=lambda c: self._decide(c, equivalent),
                    combine=lambda decided: self._verdict(decided, shrinking))

    def _equivalence(self, end: dict[str, np.ndarray], step) -> Comparison:
        """Equivalence at ``step`` within ``margin``: every pair by ``stats.tost``; the pair with the largest p is
        shown (its difference and 90% interval), its p is the test's (intersection-union)."""
        pairs = [(stats.tost(end[b], end[a], self.margin), a, b) for a, b in itertools.combinations(end, 2)]
        (p, ci), a, b = max(pairs, key=lambda x: stats.nan_last(x[0][0]))
        return Comparison(f"{b} - {a} at step {step} (equivalence within ±{self.margin:g}, 90% CI; the pair "
                          "least shown equivalent)", float(end[b].mean() - end[a].mean()), ci, p, 0,
                          tuple(len(v) for v in end.values()), ci_level=1 - 2 * ALPHA)

    def _decide(self, c: Comparison, equivalent: Comparison) -> tuple[str, str]:
        if c is not equivalent or c.by_design():
            return c.verdict()
        if c.p_adj < ALPHA:
            return "reproduced", ""
        return "inconclusive", f"not shown within ±{self.margin:g} (adjusted p {c.p_adj:.3g})"

    def _verdict(self, decided: list[Decided], shrinking: bool) -> Decided:
        """Reproduced: a gap at mid and equivalence at the end; not testable: still moving; refuted: apart at the
        end, equivalence rejected and the gap not shrinking; else inconclusive with the reason."""
        (gap, gap_v, gap_r), (equivalent, equivalent_v, equivalent_r), (moving, _, _), (apart, apart_v, _) = decided
        if gap_v == "reproduced" and equivalent_v == "reproduced":
            return equivalent, "reproduced", ""
        if moving.p < ALPHA:
            return moving, NOT_TESTABLE, (f"the arms still move relative to each other ({moving.what}, raw p "
                                          f"{moving.p:.3g}): the end of the budget is not where they settle")
        outside = equivalent.ci[0] > self.margin or equivalent.ci[1] < -self.margin
        if apart_v == "reproduced" and outside and not shrinking:
            return apart, "refuted", (f"the arms stay apart at the end (adjusted p {apart.p_adj:.3g}; equivalence "
                                      f"within ±{self.margin:g} rejected) and the gap no longer shrinks")
        if apart_v == "reproduced":
            return apart, "inconclusive", ("apart at the end, but " + ("the gap still shrinks from the late step"
                                                                       if shrinking else "equivalence not rejected"))
        if gap_v != "reproduced":
            return gap, "inconclusive", f"no gap shown at the declared step to close ({gap_r})"
        return equivalent, "inconclusive", equivalent_r

    def plan(self, d: Design, models: Models) -> list[Planned]:
        out, fams = [], families(d.configs)
        verdict = self.verdict()
        for fam in fams:
            labels = list(fam.labels)
            steps = d.steps(labels[0], "eval")
            ok = bool(declared_steps(list(steps)))
            effect, simulate = models(verdict, labels, steps)
            floors = (lambda s: [arms_floor(s), 0.0, arms_floor(s)]) if ok else (lambda s: [math.nan] * 3)
            out.append(Planned(F, verdict.named(fam.name if len(fams) > 1 else ""), "gap at the declared mid "
                               f"evaluation, equivalence of {self.measure} within ±{self.margin:g} at the end, apart "
                               "at the end", labels, d.seeds(labels), lambda s, floors=floors: at_least(s, floors(s)),
                               simulate, effect, needs="first two",
                               why="" if ok else "fewer than three evaluations at the declared shares 0.5, 0.75, 1 of "
                                                 "the budget"))
        return out

    def default(self, labels: list[str], _) -> pw.Model:
        """A gap of ``DEFAULT_EFFECT`` seed SDs at mid; the arms equal at the end, seeds spread by half the margin."""
        k, spread = len(labels), self.margin / 2
        gap, end = pw.normal([0.0] * (k - 1) + [pw.DEFAULT_EFFECT]), pw.normal([0.0] * k)
        return pw.Model(f"gap {pw.DEFAULT_EFFECT:g} seed SDs at mid; arms equal at the end, seeds SD {spread:g}",
                        lambda rng, s: (gap.draw(rng, s), [a * spread for a in end.draw(rng, s)]))

    def passes(self, arms: tuple, alpha: float) -> np.ndarray:
        """A gap at mid and every pair equivalent at the end."""
        mid, end = arms
        equal = np.all([pw.equivalent(a, b, self.margin, alpha) for i, a in enumerate(end) for b in end[i + 1:]],
                       axis=0)
        return pw.passes_means(mid, alpha, 0) & equal

    def samples(self, pilot: Runs, runs: list[list[str]]) -> list | None:
        """Per arm, ``measure`` at the pilot's declared mid and end evaluations."""
        m = pilot.metrics
        d = m[(m["metric"] == self.measure) & m["run"].isin(sum(runs, []))]
        common = d.pivot_table(index="run", columns="step", values="value").dropna(axis=1)
        steps = declared_steps(list(common.columns)) if common.shape[1] else None
        if steps is None:
            return None
        return [(common.loc[r, steps[0]].to_numpy(), common.loc[r, steps[2]].to_numpy()) for r in runs]


def _resample(samples: list, text: str) -> pw.Model:
    """The mid and the end values resampled each on its own."""
    mid, end = (pw.resampled([s[i] for s in samples], "") for i in (0, 1))
    return pw.Model(text, lambda rng, s: (mid.draw(rng, s), end.draw(rng, s)))


CONVERGENCE = Convergence().verdict()
