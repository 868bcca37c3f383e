"""Finding 3, NoPE on full layers (analysis/findings.py): for each pair of architectures differing only in
``model.pos.full``, *beyond*, the score beyond the training length conditioned on the score within it (per run
beyond - within at its last evaluation), NoPE minus RoPE (> 0), the raw beyond score as context; *cost* on
held-out natural text (``val/text_loss``, never probe-format or synthetic documents), NoPE minus RoPE minus
``LOSS_COST`` (< 0: the cost is below ``LOSS_COST`` nats per token)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hybrid_lightning.analysis import power as pw
from hybrid_lightning.analysis import tables
from hybrid_lightning.analysis.arms import nope_pairs
from hybrid_lightning.analysis.load import Runs
from hybrid_lightning.analysis.metrics import SCORE, SCORE_BEYOND
from hybrid_lightning.analysis.stats import Comparison, Test
from hybrid_lightning.analysis.verdict import Design, Models, Planned, Verdict, at_least, two_arms
from hybrid_lightning.records import Tag

F = "3. NoPE on full layers"
TEXT_LOSS = Tag.TEXT_LOSS  # held-out natural text only (training/system.py)
LOSS_COST = 0.02  # nats per token: the short-context cost NoPE may have


def _per_pair(runs: Runs, verdict: Verdict, test) -> list[Test]:
    """``test(pair, runs of each label, final values by tag)`` per pair of architectures differing only in
    ``model.pos.full``; not tested without one."""
    c = runs.configs
    pairs = nope_pairs(c)
    if not pairs:
        return [Test(F, verdict.name, verdict="not tested",
                     evidence="no SWA hybrid pair differing only in model.pos.full")]
    final = {tag: tables.final_values(runs.metrics, tag).set_index("run")["value"]
             for tag in (SCORE, SCORE_BEYOND, TEXT_LOSS)}
    runs_of = c.groupby("label")["run"].agg(list)
    return [test(p, runs_of, final) for p in pairs]


def _beyond(pair: dict[str, str], runs_of: pd.Series, final: dict[str, pd.Series]) -> Test:
    """The score beyond the training length conditioned on the score within it (per run beyond - within at its
    last evaluation), NoPE - RoPE: the claim; the raw beyond score beside it (context)."""
    name, text = BEYOND.named(pair["rope"]), f"{pair['nope']} vs {pair['rope']}"
    arms = {pos: pd.DataFrame({"within": final[SCORE].reindex(runs_of[pair[pos]]),
                               "beyond": final[SCORE_BEYOND].reindex(runs_of[pair[pos]])}).dropna()
            for pos in ("nope", "rope")}
    if any(a.empty for a in arms.values()):
        return Test(F, name, verdict="not tested", evidence=f"{text}: a run lacks {SCORE} or {SCORE_BEYOND}")
    nope, rope = arms["nope"], arms["rope"]
    conditioned = Comparison.of("NoPE - RoPE of (score beyond - score within)",
                                [(a["beyond"] - a["within"]).to_numpy() for a in (nope, rope)], +1)
    raw = Comparison.of("NoPE - RoPE score beyond (raw)", [nope["beyond"].to_numpy(), rope["beyond"].to_numpy()], +1)
    raw.claim = False
    return Test(F, name, [conditioned, raw], f"{text}: score within the training length NoPE "
                f"{nope['within'].mean():.3f} vs RoPE {rope['within'].mean():.3f}, beyond it NoPE "
                f"{nope['beyond'].mean():.3f} vs RoPE {rope['beyond'].mean():.3f}: extrapolation is judged on beyond - "
                "within, the raw beyond score shown beside it", combine=lambda decided: decided[0])


def _cost(pair: dict[str, str], runs_of: pd.Series, final: dict[str, pd.Series]) -> Test:
    name, text, loss = COST.named(pair["rope"]), f"{pair['nope']} vs {pair['rope']}", final[TEXT_LOSS]
    nl, rl = (loss.reindex(runs_of[pair[pos]]).dropna().to_numpy() for pos in ("nope", "rope"))
    if not (len(nl) and len(rl)):
        return Test(F, name, verdict="not tested", evidence=f"{text}: a run lacks {TEXT_LOSS} (the loss on held-out "
                    "natural text; val/loss is on data.files, which may be probe documents)")
    cost = Comparison.of(f"NoPE - RoPE {TEXT_LOSS} - {LOSS_COST}", [nl - LOSS_COST, rl], -1, unit="nats")
    return Test(F, name, [cost], f"{text}: {TEXT_LOSS} NoPE {nl.mean():.4f} vs RoPE {rl.mean():.4f} (cost "
                f"{nl.mean() - rl.mean():+.4f} nats; allowed {LOSS_COST})")


def _plans(verdict: Verdict, what: str, d: Design, models: Models) -> list[Planned]:
    """The design check of ``verdict`` (``what``: what it compares) per NoPE pair."""
    out = []
    for pair in nope_pairs(d.configs):
        labels = [pair["rope"], pair["nope"]]
        effect, simulate = models(verdict, labels, None)
        out.append(Planned(F, verdict.named(pair["rope"]), what, labels, d.seeds(labels),
                           lambda s: at_least(s, [two_arms(*s)]), simulate, effect))
    return out


def _final(pilot: Runs, runs: list[list[str]], tag: str) -> list[np.ndarray]:
    """Per arm, the pilot runs' ``tag`` at their last evaluation."""
    final = tables.final_values(pilot.metrics, tag).set_index("run")["value"]
    return [final.reindex(r).to_numpy() for r in runs]


def _complete(values: list[np.ndarray]) -> list[np.ndarray] | None:
    """``values``, None where a run lacks one."""
    return None if any(np.isnan(v).any() for v in values) else values


def _beyond_samples(pilot: Runs, runs: list[list[str]]) -> list | None:
    """Per arm, each pilot run's beyond - within."""
    return _complete([b - w for b, w in zip(_final(pilot, runs, SCORE_BEYOND), _final(pilot, runs, SCORE))])


def _cost_samples(pilot: Runs, runs: list[list[str]]) -> list | None:
    """Per arm, each pilot run's ``val/text_loss``, the NoPE arm's less ``LOSS_COST``."""
    return _complete([v - LOSS_COST * (i == 1) for i, v in enumerate(_final(pilot, runs, TEXT_LOSS))])


BEYOND = Verdict(F, "beyond", lambda runs: _per_pair(runs, BEYOND, _beyond),
                 lambda d, models: _plans(BEYOND, "NoPE - RoPE of (score beyond - score within)", d, models),
                 lambda labels, _: pw.normal([0.0, pw.DEFAULT_EFFECT]),
                 lambda arms, alpha: pw.passes_means(arms, alpha, 1), _beyond_samples)
COST = Verdict(F, "cost", lambda runs: _per_pair(runs, COST, _cost),
               lambda d, models: _plans(COST, f"NoPE - RoPE {TEXT_LOSS} - {LOSS_COST:g} nats", d, models),
               lambda labels, _: pw.normal([0.0, -pw.DEFAULT_EFFECT]),
               lambda arms, alpha: pw.passes_means(arms, alpha, -1), _cost_samples)
