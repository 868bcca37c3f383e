"""Verdicts on the paper's three findings (docs/analysis.md, "Findings"), each decided by a fixed rule from the
runs' tables with statistics over seeds (analysis/stats.py). ``analyze --findings`` puts them at the top
of the report (also ``findings.md``), in ``findings.csv`` (one row per test) and ``findings_comparisons.csv``.

Every test names the comparison its finding claims and states its effect, a 95% interval over seeds (Welch's t
for a difference of two arms' means, ``stats.interval``; the one-sample t for a mean of per-run values), a
permutation p, the p after Holm's adjustment over the claims of its finding, and the seeds per arm (an arm:
the runs of one architecture). A test is ``reproduced`` with at least ``stats.MIN_SEEDS`` seeds per compared
arm and an adjusted p < ``stats.ALPHA`` in the direction the paper states, ``refuted`` when significant in the
opposite direction, ``not testable`` where the claim cannot pass by design (too few seeds, too few distinct
controls: it then leaves its finding's Holm family), otherwise ``inconclusive`` with the reason (CI spans 0, p
too high);
``no signal`` where what the test looks at appeared in no run, ``not tested`` where the runs lack what it
needs, ``not testable`` where the design cannot tell what the test asks (the reason says why), ``not testable
at this budget`` where the runs stop before it can be seen. A *context* comparison is shown beside a claim
(raw p, outside the Holm family) and decides nothing.

The tests are the verdicts registered in analysis/registry.py (each one object, ``verdict.Verdict``), in their
order there; the claims of the tests of one finding form its Holm family. The built-in ones:

1. Emergence (analysis/emergence.py), within each family of hybrids that differ only in their efficient
   layers (analysis/arms.py): *speed*, censored tokens to the first evaluation above noise among the arms
   that emerge, and *emerges in more runs*, the share that emerges, two claims; *convergence*, among risen
   arms, a gap at a declared evaluation and equivalence within a stated margin at the end.
   ``val/retrieval_acc`` has no null with known sampling error and is not tested.
2. Mechanism (analysis/mechanism.py, analysis/laziness.py): *where*, retrieval heads in full layers against a
   head-level null and a layer-level null over reachable layers stratified by window; *ablation*, per
   architecture, the top-K heads against same-layer non-retrieval heads of the held-out selection report;
   *laziness*, per family of SWA hybrids alike but for the window, log-rank tests of the first step with a
   retrieval head for good, adjacent windows, monotone.
3. NoPE (analysis/nope.py). For each pair of architectures differing only in ``model.pos.full``: *beyond*, the
   score beyond the training length conditioned on the score within it (per run beyond - within), NoPE minus
   RoPE (> 0), the raw beyond score as context; *cost* on held-out natural text (``val/text_loss``, never
   probe-format or synthetic documents), NoPE minus RoPE minus ``LOSS_COST`` (< 0: the cost is below
   ``LOSS_COST`` nats per token).
"""

from __future__ import annotations

import math

import pandas as pd

from hybrid_lightning.analysis import registry, stats
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.stats import Comparison, Decided, Test
from hybrid_lightning.units import si

TEST_COLUMNS = ["finding", "test", "verdict", "compared", "effect", "unit", "ci_low", "ci_high", "p", "p_holm", "seeds",
                "reason", "evidence", "ci_level"]
COMPARISON_COLUMNS = ["finding", "test", "compared", "effect", "unit", "ci_low", "ci_high", "p", "p_holm", "seeds",
                      "verdict", "reason", "ci_level"]


def findings(runs: Runs, declared: dict | None = None) -> pd.DataFrame:
    """One row per test (``TEST_COLUMNS``); see ``verdicts``."""
    return verdicts(runs, declared)[0]


def verdicts(runs: Runs, declared: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(tests, comparisons). tests: one row per test: finding, test, verdict (``reproduced``, ``refuted``,
    ``inconclusive``, ``no signal``, ``not tested``, ``not testable at this budget``), compared (the
    comparison the verdict rests on), effect, ci_low, ci_high (95% over seeds), p, p_holm (Holm over the
    finding's tests), seeds (per arm, ``5/5``), reason (why not reproduced), evidence (the numbers, in words).
    comparisons: every comparison made, with its own verdict. ``declared``: what the grid declares for its
    verdicts (``registry.verdicts``)."""
    tests, comparisons, by_finding = [], [], {}
    for verdict in registry.verdicts(declared):  # the registered verdicts, each finding's tests one Holm family
        by_finding.setdefault(verdict.finding, []).extend(verdict.decide(runs))
    for group in by_finding.values():
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
            "p_holm": c.p_adj, "seeds": stats.seeds_text(c.seeds), "ci_level": c.ci_level}


def _row(t: Test, decided: list[Decided]) -> dict:
    """A test's verdict from its comparisons (``decided``: each with its verdict and reason): the test's own
    ``combine`` where it has one, else reproduced where some comparison is and none is refuted, refuted the
    other way round, else inconclusive; the numbers of the comparison it rests on."""
    row = {"finding": t.finding, "test": t.test, "verdict": t.verdict, "compared": "", "effect": math.nan, "unit": "",
           "ci_low": math.nan, "ci_high": math.nan, "p": math.nan, "p_holm": math.nan, "seeds": "", "reason": t.reason,
           "evidence": t.evidence, "ci_level": math.nan}
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


def markdown(tests: pd.DataFrame, comparisons: pd.DataFrame) -> str:
    """The findings table (verdict, effect with its CI, p and Holm p, seeds per arm, reason) and, below it,
    the details: each test's evidence and every comparison it made."""
    lines = ["| finding | test | verdict | effect [95% CI] | p (Holm) | seeds per arm | reason |",
             "|---|---|---|---|---|---|---|"]
    for t in tests.itertuples(index=False):
        numbers = ["", "", ""] if not t.compared else [
            f"{_num(t.effect)}{_unit(t.unit)} [{_num(t.ci_low)}, {_num(t.ci_high)}]{_level(t.ci_level)}",
            f"{t.p:.3g} ({t.p_holm:.3g})", t.seeds]
        lines.append(f"| {t.finding} | {t.test} | {t.verdict} | {' | '.join(numbers)} | {t.reason} |")
    lines += ["", "### Details", ""]
    for t in tests.itertuples(index=False):
        lines.append(f"- **{t.finding}, {t.test}**: {t.evidence}.")
        for c in comparisons[(comparisons["finding"] == t.finding)
                             & (comparisons["test"] == t.test)].itertuples(index=False):
            lines.append(f"  - {c.compared}: {_num(c.effect)}{_unit(c.unit)} [{c.ci_level:.0%} CI {_num(c.ci_low)}, "
                         f"{_num(c.ci_high)}], p {c.p:.3g}, Holm {c.p_holm:.3g}, seeds {c.seeds}: "
                         f"{c.verdict}" + (f"; {c.reason}" if c.reason else ""))
    return "\n".join(lines) + "\n"


def _level(level: float) -> str:
    """`` (90% CI)`` after a test's interval where it is not the table's 95%."""
    return "" if pd.isna(level) or round(level, 6) == stats.LEVEL else f" ({level:.0%} CI)"


def _unit(unit) -> str:
    return f" {unit}" if isinstance(unit, str) and unit else ""


def _num(v: float) -> str:
    return "nan" if pd.isna(v) else si(v)
