"""Verdicts on the paper's three findings (docs/analysis.md, "Findings"), each decided by a fixed rule from the
runs' tables with statistics over seeds (analysis/stats.py). ``analyze --findings`` puts them at the top
of the report (also ``findings.md``), in ``findings.csv`` (one row per test) and ``findings_comparisons.csv``.

Every test names the comparison its finding claims and states its effect, a 95% interval over seeds (Welch's t
for a difference of two arms' means, ``stats.interval``; the one-sample t for a mean of per-run values), a
permutation p, the p after Holm's adjustment over the claims of its finding, and the seeds per arm (an arm:
the runs of one architecture). A test is ``reproduced`` with at least ``stats.MIN_SEEDS`` seeds per compared
arm and an adjusted p < ``stats.ALPHA`` in the direction the paper states, ``refuted`` when significant in the
opposite direction, otherwise ``inconclusive`` with the reason (too few seeds, CI spans 0, p too high);
``no signal`` where what the test looks at appeared in no run, ``not tested`` where the runs lack what it
needs, ``not testable`` where the design cannot tell what the test asks (the reason says why), ``not testable
at this budget`` where the runs stop before it can be seen. A *context* comparison is shown beside a claim
(raw p, outside the Holm family) and decides nothing.

1. Emergence (analysis/emergence.py), within each family of hybrids that differ only in their efficient
   layers (analysis/arms.py): *speed*, censored tokens to the first evaluation above noise, whether each arm
   emerges reported apart from how fast; *convergence*, a gap at a declared evaluation and equivalence
   within a stated margin at the end. ``val/retrieval_acc`` has no null with known sampling error and is
   not tested.
2. Mechanism (analysis/mechanism.py, analysis/laziness.py): *where*, retrieval heads in full layers against a
   head-level null and a layer-level null over reachable layers stratified by window; *ablation*, per
   architecture, the top-K heads against same-layer non-retrieval heads of the held-out selection report;
   *laziness*, per family of SWA hybrids alike but for the window, log-rank tests of the first step with a
   retrieval head for good, adjacent windows, monotone.
3. NoPE. For each pair of architectures differing only in ``model.pos.full``: *beyond*, the score beyond the
   training length conditioned on the score within it (per run beyond - within), NoPE minus RoPE (> 0), the
   raw beyond score as context; *cost* on held-out natural text (``val/text_loss``, never probe-format or
   synthetic documents), NoPE minus RoPE minus ``LOSS_COST`` (< 0: the cost is below ``LOSS_COST`` nats per
   token).
"""

from __future__ import annotations

import math

import pandas as pd

from hybrid_lightning.analysis import stats, tables
from hybrid_lightning.analysis.emergence import F as emergence_f
from hybrid_lightning.analysis.emergence import emergence
from hybrid_lightning.analysis.arms import nope_pairs
from hybrid_lightning.analysis.laziness import laziness_tests
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.mechanism import ablation, where
from hybrid_lightning.analysis.metrics import METRICS
from hybrid_lightning.analysis.stats import Comparison, Decided, Test
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
    for group in (emergence(runs.metrics, runs.configs, SCORE, SCORE_SE) + _retrieval_acc(runs), _mechanism(runs), _nope(runs)):
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
    return [where(runs), ablation(runs), *laziness_tests(runs)]


def _retrieval_acc(runs: Runs) -> list[Test]:
    """``val/retrieval_acc`` has no null with known sampling error (its answer tokens are not counted in the
    run's records), so no level tells its rise from noise: stated where runs log it, never tested."""
    if not runs.metrics["metric"].eq(RETRIEVAL).any():
        return []
    return [Test(emergence_f, "speed (val/retrieval_acc rise)", verdict="not tested",
                 reason="no null with known sampling error: the runs do not record how many answer tokens it is over",
                 evidence="its curves are in the report; emergence is judged on the probe score, whose null standard "
                          "error is binomial")]


def _nope(runs: Runs) -> list[Test]:
    f, c = "3. NoPE on full layers", runs.configs
    pairs = nope_pairs(c)
    if not pairs:
        return [Test(f, "beyond and cost", verdict="not tested", evidence="no SWA hybrid pair differing only in model.pos.full")]
    final = {tag: tables.final_values(runs.metrics, tag).set_index("run")["value"] for tag in (SCORE, SCORE_BEYOND, TEXT_LOSS)}
    runs_of = c.groupby("label")["run"].agg(list)
    return [t for p in pairs for t in (_beyond(f, p, runs_of, final), _cost(f, p, runs_of, final[TEXT_LOSS]))]


def _beyond(f: str, pair: dict[str, str], runs_of: pd.Series, final: dict[str, pd.Series]) -> Test:
    """The score beyond the training length conditioned on the score within it (per run beyond - within at its
    last evaluation), NoPE - RoPE: the claim; the raw beyond score beside it (context)."""
    name, text = f"beyond: {pair['rope']}", f"{pair['nope']} vs {pair['rope']}"
    arms = {pos: pd.DataFrame({"within": final[SCORE].reindex(runs_of[pair[pos]]),
                               "beyond": final[SCORE_BEYOND].reindex(runs_of[pair[pos]])}).dropna() for pos in ("nope", "rope")}
    if any(a.empty for a in arms.values()):
        return Test(f, name, verdict="not tested", evidence=f"{text}: a run lacks {SCORE} or {SCORE_BEYOND}")
    nope, rope = arms["nope"], arms["rope"]
    conditioned = Comparison.of("NoPE - RoPE of (score beyond - score within)",
                                [(nope["beyond"] - nope["within"]).to_numpy(), (rope["beyond"] - rope["within"]).to_numpy()], +1)
    raw = Comparison.of("NoPE - RoPE score beyond (raw)", [nope["beyond"].to_numpy(), rope["beyond"].to_numpy()], +1)
    raw.claim = False
    return Test(f, name, [conditioned, raw], f"{text}: score within the training length NoPE {nope['within'].mean():.3f} vs "
                f"RoPE {rope['within'].mean():.3f}, beyond it NoPE {nope['beyond'].mean():.3f} vs RoPE "
                f"{rope['beyond'].mean():.3f}: extrapolation is judged on beyond - within, the raw beyond score shown beside it",
                combine=lambda decided: decided[0])


def _cost(f: str, pair: dict[str, str], runs_of: pd.Series, loss: pd.Series) -> Test:
    name, text = f"cost: {pair['rope']}", f"{pair['nope']} vs {pair['rope']}"
    nl, rl = loss.reindex(runs_of[pair["nope"]]).dropna().to_numpy(), loss.reindex(runs_of[pair["rope"]]).dropna().to_numpy()
    if not (len(nl) and len(rl)):
        return Test(f, name, verdict="not tested", evidence=f"{text}: a run lacks {TEXT_LOSS} (the loss on held-out "
                    "natural text; val/loss is on data.files, which may be probe documents)")
    cost = Comparison.of(f"NoPE - RoPE {TEXT_LOSS} - {LOSS_COST}", [nl - LOSS_COST, rl], -1, unit="nats")
    return Test(f, name, [cost], f"{text}: {TEXT_LOSS} NoPE {nl.mean():.4f} vs RoPE {rl.mean():.4f} (cost "
                f"{nl.mean() - rl.mean():+.4f} nats; allowed {LOSS_COST})")


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
