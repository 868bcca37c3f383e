"""Head ablation after Wu et al. 2024 (arXiv 2404.15574): mask chosen attention heads (their output
multiplied by 0 through ``Attention.head_mask``) and rerun the long-context (NIAH) evaluation; the
drop against the unmasked model says whether those heads carry retrieval.

Heads are chosen as the top K by retrieval score, K random heads drawn (seeded) among the attention
heads outside that top K, so that the control never masks a head the top-K ablation masks, or an
explicit list ``layer.head``.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from hybrid_lightning.eval.heads import attention_layers
from hybrid_lightning.eval.report import pool
from hybrid_lightning.eval.runner import LongContextEval

SELECTIONS = {"top": "--mask-top", "random": "--mask-random", "list": "--mask"}  # selection -> its CLI option


def parse_heads(items: list[str]) -> list[tuple[int, int]]:
    """``["3.0", "3.2"]`` -> [(3, 0), (3, 2)]."""
    out = []
    for item in items:
        layer, sep, head = item.partition(".")
        if not (sep and layer.isdigit() and head.isdigit()):
            raise ValueError(f"--mask: {item!r} is not LAYER.HEAD (e.g. 3.1)")
        out.append((int(layer), int(head)))
    return out


def choose_heads(report: dict, selection: str, k: int | None = None, listed: list[tuple[int, int]] = (),
                 seed: int = 0) -> list[tuple[int, int]]:
    """The heads to mask, as (layer, head), from a retrieval-head report (``RetrievalHeads.run``).

    Args:
        selection: ``top`` (the K best scores), ``random`` (K heads outside the top K) or ``list``.
        k: K for ``top`` and ``random``.
        listed: the heads for ``list``; each must be an attention head of the model.
        seed: seed of the random draw.
    """
    option = SELECTIONS.get(selection)
    if option is None:
        raise ValueError(f"head selection {selection!r} is not one of {sorted(SELECTIONS)}")
    heads = [(r["layer"], r["head"]) for r in report["heads"]]
    if selection == "list":
        unknown = [h for h in listed if h not in heads]
        if unknown or not listed:
            layers = sorted({layer for layer, _ in heads})
            n_heads = 1 + max((h for _, h in heads), default=-1)
            raise ValueError(f"--mask: {[f'{a}.{b}' for a, b in unknown] or 'nothing'} is not a list of attention heads "
                             f"(attention layers {layers}, {n_heads} heads each)")
        return list(dict.fromkeys(listed))
    if k is None or not 1 <= k <= len(heads):
        raise ValueError(f"{option}: K must be between 1 and {len(heads)} (the model's attention heads), got {k}")
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
    raise ValueError(f"{option} {k}: the top {k} is not defined: heads {' '.join(tied)} tie at score {ranked[k - 1]:.4g} "
                     f"for places {above + 1} to {above + len(tied)}; "
                     + (f"choose K = {' or '.join(map(str, ks))}, or " if ks else "") + "score more probes")


@contextlib.contextmanager
def masked(model, heads: list[tuple[int, int]]):
    """Within the block, the output of each (layer, head) in ``heads`` is zero."""
    layers = dict(attention_layers(model))
    saved = {i: m.head_mask for i, m in layers.items()}
    try:
        for layer, head in heads:
            mixer = layers[layer]
            mask = torch.ones(mixer.n_heads, device=mixer.wo.weight.device) if mixer.head_mask is None else mixer.head_mask.clone()
            mask[head] = 0.0
            mixer.head_mask = mask
        yield
    finally:
        for i, m in layers.items():
            m.head_mask = saved[i]


def ablate(model, ev: LongContextEval, heads: list[tuple[int, int]], *, selection: str, k: int | None, seed: int | None,
           step: int, tokens: int, dtype: torch.dtype | None = None) -> list[dict]:
    """Runs ``ev`` with and without ``heads`` masked; one row per (task, length), pooled over depths:
    exact match, token accuracy and answer loss unmasked and masked, and the chance levels."""
    base = ev.run(model, step=step, tokens=tokens, dtype=dtype, generate=False)["records"]
    with masked(model, heads):
        after = ev.run(model, step=step, tokens=tokens, dtype=dtype, generate=False)["records"]
    rows = []
    for task, length in dict.fromkeys((r["task"], r["length"]) for r in base):
        b, a = pool(base, task=task, length=length), pool(after, task=task, length=length)
        rows.append({
            "step": step, "tokens": tokens, "selection": selection, "k": k, "seed": seed,
            "masked": [list(h) for h in heads], "task": task, "length": length, "n": b["n"],
            "accuracy": b["accuracy"], "masked_accuracy": a["accuracy"],
            "token_accuracy": b["token_accuracy"], "masked_token_accuracy": a["token_accuracy"],
            "answer_loss": b["answer_loss"], "masked_answer_loss": a["answer_loss"],
            "chance_token_accuracy": b["chance_token_accuracy"], "chance_loss": b["chance_loss"],
        })
    return rows
