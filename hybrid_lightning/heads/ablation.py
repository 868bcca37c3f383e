"""Head ablation after Wu et al. 2024 (arXiv 2404.15574): mask chosen attention heads and rerun the
long-context (NIAH) evaluation; the drop against the unmasked model says whether those heads carry
retrieval. Two masking modes (``MASK_MODES``): ``zero``, the head's output multiplied by 0
(``Attention.head_mask``); ``uniform``, the head's pre-softmax logits set to 0 (its query zeroed,
``Attention.uniform_heads``), so that it attends uniformly over the keys it can see and outputs the mean
of their values, as Wu et al. mask heads.

Heads are chosen as the top K by retrieval score, K random heads drawn (seeded) among the attention
heads outside that top K, so that the control never masks a head the top-K ablation masks, or an
explicit list ``layer.head``. The scores that choose them come from held-out probes (another probe
seed, ``eval.heads.selection_seed``), so the heads are not chosen on the probes they are tested on.

Tests the setup cannot force: the top K against ``controls`` random draws of as many heads from the
same layers that are neither in the top K nor retrieval heads (per layer as many as the top K has there;
selection ``control``; none where the top K fills a layer: it then has no same-layer control) and against
as many draws of K heads that are not retrieval heads, from any layer (Wu et al.'s contrast; selection
``control_nonretrieval``), each with the permutation p (1 + #{draws at least as harmful}) / (1 + draws),
harm being the drop in token accuracy. Retrieval heads are those of the held-out report that chose the top
K, so that the controls are not chosen on the probes they are scored on either. The draws are seeded by the
given seed, the run and the step, so that every run and checkpoint gets fresh ones; and every attention
head masked alone.
"""

from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np
import torch

from hybrid_lightning.config import EvalConfig
from hybrid_lightning.eval.runner import LongContextEval
from hybrid_lightning.heads.retrieval import RetrievalHeads, attention_layers
from hybrid_lightning.probes.check import check_lengths
from hybrid_lightning.records import pool, row

SELECTIONS = {"top": "--mask-top", "random": "--mask-random", "list": "--mask"}  # selection -> its CLI option
MASK_MODES = ("zero", "uniform")  # a masked head's output is 0 / its attention is uniform (logits 0)


def parse_heads(items: list[str]) -> list[tuple[int, int]]:
    """``["3.0", "3.2"]`` -> [(3, 0), (3, 2)]."""
    out = []
    for item in items:
        layer, sep, head = item.partition(".")
        if not (sep and layer.isdigit() and head.isdigit()):
            raise ValueError(f"--mask: {item!r} is not LAYER.HEAD (e.g. 3.1)")
        out.append((int(layer), int(head)))
    return out


def check_selection(heads: list[tuple[int, int]], selection: str, k: int | None = None,
                    listed: list[tuple[int, int]] = ()) -> str:
    """Refuses a selection of ``heads`` (the model's attention heads as (layer, head)) that cannot be made: an
    unknown selection, a listed head that is none of them, a K outside 1 to their number. Returns its option."""
    option = SELECTIONS.get(selection)
    if option is None:
        raise ValueError(f"head selection {selection!r} is not one of {sorted(SELECTIONS)}")
    if selection == "list":
        unknown = [h for h in listed if h not in heads]
        if unknown or not listed:
            layers = sorted({layer for layer, _ in heads})
            n_heads = 1 + max((h for _, h in heads), default=-1)
            raise ValueError(f"--mask: {[f'{a}.{b}' for a, b in unknown] or 'nothing'} is not a list of attention "
                             f"heads (attention layers {layers}, {n_heads} heads each)")
    elif k is None or not 1 <= k <= len(heads):
        raise ValueError(f"{option}: K must be between 1 and {len(heads)} (the model's attention heads), got {k}")
    return option


def choose_heads(report: dict, selection: str, k: int | None = None, listed: list[tuple[int, int]] = (),
                 seed: int = 0) -> list[tuple[int, int]]:
    """The heads to mask, as (layer, head), from a retrieval-head report (``RetrievalHeads.run``).

    Args:
        selection: ``top`` (the K best scores), ``random`` (K heads outside the top K) or ``list``.
        k: K for ``top`` and ``random``.
        listed: the heads for ``list``; each must be an attention head of the model.
        seed: seed of the random draw.
    """
    heads = [(r["layer"], r["head"]) for r in report["heads"]]
    option = check_selection(heads, selection, k, listed)
    if selection == "list":
        return list(dict.fromkeys(listed))
    ranked = [(r["layer"], r["head"]) for r in sorted(report["heads"], key=lambda r: -(r["score"] or 0.0))]
    if selection == "top":
        if report["kept"] == 0:
            raise ValueError(f"{option}: no retrieval scores to rank (no probe passed eval.heads.min_answer_accuracy)")
        check_no_tie(report, k, option)
        return ranked[:k]
    others = ranked[k:]
    if k > len(others):
        raise ValueError(f"{option}: K={k} leaves only {len(others)} heads outside the top {k} to draw from")
    picks = np.random.default_rng(seed).choice(len(others), size=k, replace=False)
    return sorted(others[i] for i in picks)


def check_no_tie(report: dict, k: int, option: str = "--mask-top") -> None:
    """A ``ValueError`` naming the tied heads when the K-th and (K+1)-th best retrieval scores are
    equal (all zero included): which K heads are "the top K" would then be an accident of order."""
    scores = {(r["layer"], r["head"]): r["score"] or 0.0 for r in report["heads"]}
    ranked = sorted(scores.values(), reverse=True)
    if k >= len(ranked) or ranked[k - 1] != ranked[k]:
        return
    tied = [f"{a}.{b}" for (a, b), v in scores.items() if v == ranked[k - 1]]
    above = sum(v > ranked[k - 1] for v in ranked)
    ks = [n for n in (above, above + len(tied)) if 0 < n < len(ranked)]
    raise ValueError(f"{option} {k}: the top {k} is not defined: heads {' '.join(tied)} tie at score "
                     f"{ranked[k - 1]:.4g} for places {above + 1} to {above + len(tied)}; "
                     + (f"choose K = {' or '.join(map(str, ks))}, or " if ks else "") + "score more probes")


@contextlib.contextmanager
def masked(model, heads: list[tuple[int, int]], mode: str = "zero"):
    """Within the block, each (layer, head) in ``heads`` is masked: its output zero (``mode`` zero) or its
    attention uniform over the keys it can see (``uniform``: pre-softmax logits 0)."""
    if mode not in MASK_MODES:
        raise ValueError(f"--mask-mode: {mode!r} is not one of {list(MASK_MODES)}")
    layers = dict(attention_layers(model))
    saved = {i: (m.head_mask, m.uniform_heads) for i, m in layers.items()}
    try:
        for layer, head in heads:
            mixer = layers[layer]
            device = mixer.wo.weight.device
            if mode == "zero":
                mixer.head_mask = (torch.ones(mixer.n_heads, device=device) if mixer.head_mask is None
                                   else mixer.head_mask.clone())
                mixer.head_mask[head] = 0.0
            else:
                mixer.uniform_heads = (torch.zeros(mixer.n_heads, dtype=torch.bool, device=device)
                                       if mixer.uniform_heads is None else mixer.uniform_heads.clone())
                mixer.uniform_heads[head] = True
        yield
    finally:
        for i, m in layers.items():
            m.head_mask, m.uniform_heads = saved[i]


def ablate(model, ev: LongContextEval, heads: list[tuple[int, int]], *, selection: str, k: int | None, seed: int | None,
           step: int, tokens: int, dtype: torch.dtype | None = None, base: list[dict] | None = None,
           mode: str = "zero", draw: int | None = None) -> list[dict]:
    """Runs ``ev`` with and without ``heads`` masked (``mode``: ``MASK_MODES``); one row per (task, length),
    pooled over depths: exact match, token accuracy and answer loss unmasked and masked, and the chance
    levels. ``base``: the unmasked run's records, when already evaluated; ``draw``: a control draw's index."""
    base = base if base is not None else ev.run(model, step=step, tokens=tokens, dtype=dtype, generate=False)["records"]
    with masked(model, heads, mode):
        after = ev.run(model, step=step, tokens=tokens, dtype=dtype, generate=False)["records"]
    rows = []
    for task, length in dict.fromkeys((r["task"], r["length"]) for r in base):
        b, a = pool(base, task=task, length=length), pool(after, task=task, length=length)
        rows.append(row(
            "ablation", step=step, tokens=tokens, selection=selection, mode=mode, k=k, seed=seed, draw=draw,
            masked=[list(h) for h in heads], task=task, length=length, n=b["n"],
            accuracy=b["accuracy"], masked_accuracy=a["accuracy"],
            token_accuracy=b["token_accuracy"], masked_token_accuracy=a["token_accuracy"],
            answer_loss=b["answer_loss"], masked_answer_loss=a["answer_loss"],
            chance_token_accuracy=b["chance_token_accuracy"], chance_loss=b["chance_loss"],
        ))
    return rows


def selection_seed(cfg: EvalConfig) -> int:
    """The probe seed of the scores that choose heads: ``eval.heads.selection_seed``, else eval.seed + 1."""
    return cfg.seed + 1 if cfg.heads.selection_seed is None else cfg.heads.selection_seed


def selection_report(model, cfg: EvalConfig, tokenizer, held_out: np.ndarray, scored: dict, *, step: int, tokens: int,
                     dtype: torch.dtype | None = None) -> dict:
    """The retrieval-head report that chooses heads to ablate: the heads probes drawn with
    ``selection_seed`` (held out from ``scored``, the report on eval.seed), or ``scored`` itself when
    that seed is eval.seed."""
    seed = selection_seed(cfg)
    if seed == cfg.seed:
        return scored
    return RetrievalHeads(cfg.model_copy(update={"seed": seed}), tokenizer, held_out).run(model, step=step,
                                                                                        tokens=tokens, dtype=dtype)


def harm(rows: list[dict]) -> float:
    """Drop in token accuracy of an ablation's rows, weighted by their probes."""
    return sum(r["n"] * (r["token_accuracy"] - r["masked_token_accuracy"]) for r in rows) / sum(r["n"] for r in rows)


def permutation_p(observed: float, draws: list[float]) -> float:
    """Share of random draws at least as extreme as ``observed``, counting the observation itself
    (Phipson & Smyth 2010): (1 + #{d >= observed}) / (1 + n); never 0."""
    return (1 + sum(d >= observed for d in draws)) / (1 + len(draws))


def layer_matched_draws(report: dict, top: list[tuple[int, int]], n: int, seed) -> list[list[tuple[int, int]]]:
    """``n`` random head sets matched to ``top`` layer by layer: from each layer holding c heads of
    ``top``, c of its attention heads that are neither in ``top`` nor retrieval heads in ``report`` (the
    report that chose ``top``); empty where a layer has fewer such heads than c (``top`` fills it, or its
    other heads are retrieval heads). ``seed``: an int or a sequence of ints (numpy's seeding)."""
    rng = np.random.default_rng(seed)
    per_layer = Counter(layer for layer, _ in top)
    heads_of = {layer: sorted(r["head"] for r in report["heads"] if r["layer"] == layer and not r.get("retrieval")
                              and (layer, r["head"]) not in top) for layer in per_layer}
    if any(len(heads_of[layer]) < c for layer, c in per_layer.items()):
        return []
    draws = []
    for _ in range(n):
        draw = [(layer, heads_of[layer][i]) for layer, c in sorted(per_layer.items())
                for i in rng.choice(len(heads_of[layer]), size=c, replace=False)]
        draws.append(sorted(draw))
    return draws


def nonretrieval_draws(report: dict, top: list[tuple[int, int]], n: int, seed) -> list[list[tuple[int, int]]]:
    """``n`` random sets of len(top) attention heads among those that are not retrieval heads in ``report``
    (the report that chose ``top``; Wu et al.'s contrast), from any layer; empty where there are fewer such
    heads than len(top)."""
    pool_ = sorted((r["layer"], r["head"]) for r in report["heads"] if not r.get("retrieval"))
    if len(pool_) < len(top):
        return []
    rng = np.random.default_rng(seed)
    return [sorted(pool_[i] for i in rng.choice(len(pool_), size=len(top), replace=False)) for _ in range(n)]


CONTROLS = {"control": ("layer", layer_matched_draws), "control_nonretrieval": ("non-retrieval", nonretrieval_draws)}


def control_test(model, ev: LongContextEval, report: dict, top: list[tuple[int, int]], top_rows: list[dict],
                 base: list[dict], *, controls: int, seed, step: int, tokens: int, dtype: torch.dtype | None = None,
                 mode: str = "zero") -> tuple[list[dict], list[dict]]:
    """The top-K ablation (its rows ``top_rows``) against ``controls`` draws of each kind of ``CONTROLS``
    (layer-matched; non-retrieval heads), drawn by ``report``'s retrieval marks (the held-out report that
    chose ``top``): the draws' ablation rows (their selection, ``draw`` = its index) and one test per kind
    that has draws: harm of the top K, of every draw, and the permutation p."""
    rows, tests, top_harm = [], [], harm(top_rows)
    for selection, (match, draw_heads) in CONTROLS.items():
        harms = []
        for i, heads in enumerate(draw_heads(report, top, controls, seed)):
            mine = ablate(model, ev, heads, selection=selection, k=len(top), seed=None, step=step, tokens=tokens,
                          dtype=dtype, base=base, mode=mode, draw=i)
            rows += mine
            harms.append(harm(mine))
        if harms:
            tests.append({"step": step, "tokens": tokens, "k": len(top), "masked": [list(h) for h in top],
                          "seed": list(np.atleast_1d(seed).tolist()), "match": match, "mode": mode, "draws": len(harms),
                          "measure": "token_accuracy drop", "harm": top_harm, "draw_harms": harms,
                          "p": permutation_p(top_harm, harms)})
    return rows, tests


def ablations(model, cfg: EvalConfig, tokenizer, held_out: np.ndarray, report: dict, *, selection: str | None,
              k: int | None = None, listed: list[tuple[int, int]] = (), seed: int = 0, controls: int = 0,
              each: bool = False, step: int, tokens: int, dtype: torch.dtype | None = None, mode: str = "zero",
              run_key: int = 0, window: int | None) -> dict:
    """Head ablations of ``model`` on the long-context probes of ``cfg`` (no held-out text): the
    ``selection`` (``choose_heads`` on ``selection_report``'s scores), with ``selection == "top"``
    its tests against ``controls`` draws of each kind (``control_test``, seeded by [seed, run_key, step]:
    fresh draws for every run and checkpoint), and with ``each`` every attention head alone; every masking
    in ``mode``; ``window``: the model's run plan's (``LongContextEval``). Returns the keys to add to the heads
    report: ``ablation`` rows, ``ablation_tests``, ``selection``."""
    check_lengths(cfg, tokenizer)
    out = {"ablation": [], "ablation_tests": []}
    if selection is not None:  # chosen first: a bad choice fails before any evaluation
        chooser = report if selection == "list" else selection_report(model, cfg, tokenizer, held_out, report,
                                                                       step=step, tokens=tokens, dtype=dtype)
        heads = choose_heads(chooser, selection, k, listed, seed)
        if selection != "list":
            out["selection"] = {"seed": selection_seed(cfg), "heads": [
                {"layer": r["layer"], "head": r["head"], "score": r["score"]} for r in chooser["heads"]]}
    ev = LongContextEval(cfg.model_copy(update={"position_sequences": 0}), tokenizer, held_out, window=window)
    base = ev.run(model, step=step, tokens=tokens, dtype=dtype, generate=False)["records"]
    if selection is not None:
        chosen = ablate(model, ev, heads, selection=selection, k=k, seed=seed if selection == "random" else None,
                        step=step, tokens=tokens, dtype=dtype, base=base, mode=mode)
        out["ablation"] += chosen
        if selection == "top" and controls:
            rows, tests = control_test(model, ev, chooser, heads, chosen, base, controls=controls,
                                       seed=[seed, run_key, step], step=step, tokens=tokens, dtype=dtype, mode=mode)
            out["ablation"] += rows
            out["ablation_tests"] += [test | {"selection_seed": selection_seed(cfg)} for test in tests]
    if each:
        for head in [(r["layer"], r["head"]) for r in report["heads"]]:
            out["ablation"] += ablate(model, ev, [head], selection="single", k=1, seed=None, step=step, tokens=tokens,
                                      dtype=dtype, base=base, mode=mode)
    return out
