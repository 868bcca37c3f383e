"""Verdicts on the paper's three findings (README, "Analysis"), each decided by a fixed rule from the
runs' tables, with the numbers it rests on. ``analyze --findings`` puts them at the top of the report
and in ``findings.csv``.

The rules use the chance-corrected probe score ``longctx/token_acc`` (answer-token accuracy minus
chance, analysis/scores.py) and the retrieval heads of eval/heads_step_<k>.json:

1. Emergence, of the probe score and of the rise of ``val/retrieval_acc`` over the mean of each
   run's first ``START_VALIDATIONS`` validations (in-context retrieval on synthetic sequences at the training length). Signal: some
   architecture ends with a seed-mean value >= ``SIGNAL``. *Speed*: the
   tokens at which each seed first reaches half the best architecture's final score; the design sets
   the speed when two architectures' seed ranges of those tokens do not overlap (an architecture
   that never reaches it counts as later than every token seen). *Convergence*: the spread of the
   architectures' seed-mean scores at the last common evaluation is below half its largest value
   during training.
2. Mechanism. *Where*: at each SWA hybrid's last scoring, the share of its retrieval heads that lie in
   full-attention layers (>= ``FULL_SHARE`` reproduces; heads in fewer than ``MIN_RUNS`` runs: no signal). *Ablation*: masking the top-K heads lowers
   probe token accuracy (probes within the training length) by at least ``ABLATION_DROP`` and by at
   least twice as much as masking K random heads (mean over the ablated runs). *Laziness*: among the SWA hybrids with RoPE on their
   full layers, the first step from which every later scoring has a retrieval head (so a head that
   comes and goes does not count; mean over seeds; never = after the last step) does not decrease as
   the window grows and increases at least once.
3. NoPE. For each pair of architectures differing only in ``model.pos.full``: the score beyond the
   training length is higher with NoPE in every seed (the lowest NoPE seed above the highest RoPE
   seed), and the validation loss rises by at most ``LOSS_COST`` nats per token.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from analysis import tables
from analysis.load import Runs
from hybrid_lightning.units import si

SCORE = "longctx/token_acc"
SCORE_BEYOND = "longctx/token_acc_beyond"
RETRIEVAL = "val/retrieval_acc"
START_VALIDATIONS = 3  # the rise of val/retrieval_acc is over the mean of a run's first 3 validations
MIN_RUNS = 2  # retrieval heads must be present in at least this many runs to count as a signal
SIGNAL = 0.05  # answer-token accuracy above chance that counts as retrieval
FULL_SHARE = 0.8
ABLATION_DROP = 0.05
LOSS_COST = 0.02  # nats per token


def findings(runs: Runs) -> pd.DataFrame:
    """One row per test: finding, test, verdict (``reproduced``, ``not reproduced``, ``no signal``,
    ``not tested``), evidence (the numbers, in words)."""
    rows = [*_emergence(runs), *_mechanism(runs), *_nope(runs)]
    return pd.DataFrame(rows, columns=["finding", "test", "verdict", "evidence"])


def _row(finding: str, test: str, verdict: str, evidence: str) -> dict:
    return {"finding": finding, "test": test, "verdict": verdict, "evidence": evidence}


def _si(tokens: float) -> str:
    return "never" if math.isinf(tokens) or math.isnan(tokens) else si(tokens)


def _emergence(runs: Runs) -> list[dict]:
    rows = _emergence_of(runs.metrics, SCORE, "probes")
    # In-context retrieval at the training length on synthetic validation sequences: each run's rise
    # over the mean of its first validations (chance is not logged for it).
    acc = runs.metrics[runs.metrics["metric"] == RETRIEVAL].sort_values("step")
    start = acc.groupby("run")["value"].transform(lambda v: v.iloc[:START_VALIDATIONS].mean())
    rise = acc.assign(value=acc["value"] - start)
    return rows + _emergence_of(rise, RETRIEVAL, "val/retrieval_acc rise")


def _emergence_of(metrics: pd.DataFrame, tag: str, what: str) -> list[dict]:
    f = "1. emergence speed"
    curve = tables.curves(metrics, tag)
    if curve.empty:
        return [_row(f, f"speed ({what})", "not tested", f"no run has logged {tag}")]
    final = curve.sort_values("step").groupby("label").last()["mean"]
    best = final.max()
    finals = ", ".join(f"{label}: {v:.3f}" for label, v in final.sort_values(ascending=False).items())
    if best < SIGNAL:
        text = f"final {what} below {SIGNAL} for every architecture ({finals})"
        return [_row(f, f"speed ({what})", "no signal", text), _row(f, f"convergence ({what})", "no signal", text)]
    target = best / 2
    d = metrics[metrics["metric"] == tag]
    first = {}  # label -> per-seed tokens of the first evaluation at or above the target
    for (label, run), r in d.groupby(["label", "run"]):
        hit = r[r["value"] >= target]
        first.setdefault(label, []).append(hit["tokens"].min() if len(hit) else math.inf)
    ranges = {label: (min(v), max(v)) for label, v in first.items()}
    order = sorted(ranges, key=lambda k: (ranges[k][0], ranges[k][1]))
    separated = [(a, b) for i, a in enumerate(order) for b in order[i + 1:]
                 if ranges[a][1] < ranges[b][0] and not math.isinf(ranges[a][1])]
    speed = ("reproduced" if separated else "not reproduced",
             f"target {target:.3f} (half the best final {what}; finals {finals}); tokens to reach it, seed range: "
             + "; ".join(f"{k}: {_si(ranges[k][0])}-{_si(ranges[k][1])}" for k in order)
             + (f". Separated pairs: {len(separated)}, e.g. {separated[0][0]} before {separated[0][1]}" if separated
                else ". No two architectures' seed ranges are apart"))
    # Spread across architectures over the evaluations all of them have reached.
    common = curve.pivot_table(index="step", columns="label", values="mean").dropna()
    spread = (common.max(axis=1) - common.min(axis=1)) if len(common.columns) > 1 else pd.Series(dtype=float)
    if spread.empty:
        conv = ("not tested", "fewer than two architectures share evaluation steps")
    else:
        converged = spread.iloc[-1] < spread.max() / 2
        conv = ("reproduced" if converged else "not reproduced",
                f"spread of the architectures' seed-mean {what}: {spread.max():.3f} at step {spread.idxmax()}, "
                f"{spread.iloc[-1]:.3f} at the last common step {spread.index[-1]}")
    return [_row(f, f"speed ({what})", *speed), _row(f, f"convergence ({what})", *conv)]


def _mechanism(runs: Runs) -> list[dict]:
    f = "2. retrieval heads"
    c = runs.configs
    swa = c[c["model.mixer"].eq("swa") & c["model.pattern"].astype(str).str.contains("E")]["run"]
    rows = []
    h = runs.heads[runs.heads["run"].isin(swa)]
    if h.empty:
        rows.append(_row(f, "where", "not tested", "no SWA hybrid has retrieval-head scores"))
    else:
        last = h[h["step"] == h.groupby("run")["step"].transform("max")]
        ret = last[last["retrieval"].astype(bool)]
        by_kind = ret.groupby("kind").size().to_dict()
        n = len(ret)
        share = by_kind.get("full", 0) / n if n else float("nan")
        evidence = (f"retrieval heads at the last scoring of {last['run'].nunique()} SWA hybrids: {n} "
                    f"({by_kind.get('full', 0)} in full-attention layers, {by_kind.get('swa', 0)} in SWA layers)")
        with_heads = ret["run"].nunique()
        evidence += f" in {with_heads} runs"
        verdict = "no signal" if with_heads < MIN_RUNS else ("reproduced" if share >= FULL_SHARE else "not reproduced")
        rows.append(_row(f, "where", verdict,
                         evidence + ("" if n == 0 else f"; share in full layers {share:.2f} (rule: >= {FULL_SHARE})")))
    rows.append(_ablation(runs))
    rows.append(_laziness(runs))
    return rows


def _ablation(runs: Runs) -> dict:
    f = "2. retrieval heads"
    a = tables.ablation(runs.ablations, runs.configs)
    if a.empty or not {"top", "random"} <= set(a["selection"]):
        return _row(f, "ablation", "not tested", "no run has both a top-K and a random-K head ablation")
    a = a[a["within"]]  # within the training length, where retrieval can have formed
    per = a.groupby(["run", "selection"])["token_drop"].mean().unstack()
    per = per.dropna(subset=["top", "random"])
    top, rnd = per["top"].mean(), per["random"].mean()
    ok = top >= ABLATION_DROP and top >= 2 * rnd
    k = ", ".join(sorted({str(int(x)) for x in a["k"].dropna()}))
    draws = a[a["selection"] == "random"].groupby("run")["seed"].nunique()
    return _row(f, "ablation", "reproduced" if ok else "not reproduced",
                f"probe token accuracy drop over {len(per)} runs (K = {k}): top-K heads {top:.3f}, random K heads "
                f"{rnd:.3f} (rule: top >= {ABLATION_DROP} and >= 2x random); per run: "
                + "; ".join(f"{run}: {r['top']:.3f} vs {r['random']:.3f} (random draws: {draws.get(run, 0)})"
                            for run, r in per.iterrows()))


def _laziness(runs: Runs) -> dict:
    f, c = "2. retrieval heads", runs.configs
    rope = c[c["model.mixer"].eq("swa") & c["model.pattern"].astype(str).str.contains("E") & c["model.pos.full"].eq("rope")]
    first = _stable_first_heads(runs.metrics[runs.metrics["run"].isin(rope["run"])], c)
    if first["window"].nunique() < 2:
        return _row(f, "laziness", "not tested", "fewer than two SWA windows with retrieval-head scores")
    after = int(runs.metrics["step"].max()) + 1  # a seed without a head counts as forming it after the last step
    by_window = first.assign(step=first["first_step"].fillna(after)).groupby("window")
    evidence = ("first step with a retrieval head, per window (seeds; never = none by the end): "
                + "; ".join(f"W={int(w)}: {', '.join('never' if np.isnan(x) else str(int(x)) for x in g['first_step'])}"
                            for w, g in by_window))
    if first["first_step"].isna().all():
        return _row(f, "laziness", "no signal", evidence)
    means = by_window["step"].mean().sort_index().tolist()
    monotone = all(a <= b for a, b in zip(means, means[1:])) and any(a < b for a, b in zip(means, means[1:]))
    return _row(f, "laziness", "reproduced" if monotone else "not reproduced",
                evidence + " (rule: the seed-mean first step never falls and rises at least once as the window grows; "
                "a seed without a head counts as one step after the last)")


def _stable_first_heads(metrics: pd.DataFrame, configs: pd.DataFrame) -> pd.DataFrame:
    """``tables.first_heads`` with the first step from which every later scoring has a retrieval head."""
    counts = metrics[metrics["metric"] == "heads/retrieval_heads"].sort_values(["run", "step"])
    # a scoring counts once it and all later ones of its run have a head: reverse cumulative minimum
    stable = counts.assign(value=counts.iloc[::-1].groupby("run")["value"].cummin().iloc[::-1])
    return tables.first_heads(pd.concat([metrics[metrics["metric"] != "heads/retrieval_heads"], stable]), configs)


def _nope(runs: Runs) -> list[dict]:
    f, c = "3. NoPE on full layers", runs.configs
    arch = c.drop_duplicates("label").set_index("label")["arch"].map(json.loads)
    groups: dict[str, dict[str, str]] = {}
    for label, identity in arch.items():
        if identity.get("model.mixer") == "swa" and "model.pos.full" in identity:
            rest = json.dumps({k: v for k, v in identity.items() if k != "model.pos.full"}, sort_keys=True, default=str)
            groups.setdefault(rest, {})[identity["model.pos.full"]] = label
    pairs = [p for p in groups.values() if {"rope", "nope"} <= p.keys()]
    if not pairs:
        return [_row(f, "long context and short-context cost", "not tested", "no SWA hybrid pair differing only in model.pos.full")]
    beyond = tables.final_values(runs.metrics, SCORE_BEYOND).set_index("run")["value"]
    loss = tables.final_values(runs.metrics, "val/loss").set_index("run")["value"]
    runs_of = c.groupby("label")["run"].agg(list)
    rows = []
    for p in pairs:
        nb, rb = beyond.reindex(runs_of[p["nope"]]).dropna(), beyond.reindex(runs_of[p["rope"]]).dropna()
        nl, rl = loss.reindex(runs_of[p["nope"]]).dropna(), loss.reindex(runs_of[p["rope"]]).dropna()
        if nb.empty or rb.empty or nl.empty or rl.empty:
            rows.append(_row(f, p["rope"], "not tested", "a run of the pair lacks the score beyond the training length or val/loss"))
            continue
        better = nb.min() > rb.max()
        cost = nl.mean() - rl.mean()
        verdict = "reproduced" if better and cost <= LOSS_COST else "not reproduced"
        rows.append(_row(f, p["rope"], verdict,
                         f"score beyond the training length, NoPE {nb.mean():.3f} (seeds {nb.min():.3f}-{nb.max():.3f}) vs "
                         f"RoPE {rb.mean():.3f} ({rb.min():.3f}-{rb.max():.3f}); val/loss NoPE {nl.mean():.4f} vs RoPE "
                         f"{rl.mean():.4f} (cost {cost:+.4f} nats; rule: every NoPE seed above every RoPE seed and cost "
                         f"<= {LOSS_COST})"))
    return rows
