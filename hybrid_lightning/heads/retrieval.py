"""Retrieval heads: the retrieval score of Wu et al. 2024 (*Retrieval Head Mechanistically Explains
Long-Context Factuality*, arXiv 2404.15574) for every attention head, with the records that tell a
head that copies the needle from one that only finds it.

Wu et al. run needle-in-a-haystack probes and, at each answer step, take for every (layer, head)
the key position that the head's attention weights most. It is a hit when that position lies in
the needle and holds the token being produced; a head's score is its hits per answer token,
averaged over samples (they keep samples answered with ROUGE-1 recall > 0.5); a head scoring above
0.1 is a retrieval head. Here:

- The answer is teacher-forced (one forward of prompt + answer, ``scoring.score_samples``), so the
  token being produced at each answer step is the answer's own: heads are judged at the right
  continuation whether or not the model would produce it, and the score is defined long before the
  model answers. ``eval.heads.min_answer_accuracy`` restores Wu et al.'s filter (their 0.5 becomes
  "more than half the answer tokens argmax-correct"); it is off by default because a small model
  answers almost nothing while its heads form, which is when one wants to watch them.
- ``score`` counts a hit only on the position the answer token is copied from
  (``Sample.answer_source``, or the same offset in another statement of the same value: the pass key
  is stated twice). ``token_score`` is Wu et al.'s test, any needle position holding the same token:
  with a large subword vocabulary the two agree, with bytes a digit recurs inside a value and a head
  looking anywhere in it matches by repetition alone (about 1/10 per step for digits).
- Copying, not only finding: a head that spreads its attention over a k-token answer span lands on
  the right token 1/k of the time, a score above 0.1 for k < 10. So the probes use answers of at least
  ``eval.heads.value_tokens`` (16) tokens and every head also records ``in_span`` (share of answer
  steps whose argmax is in the span of the value being copied), ``copy_precision`` (hits / in-span
  argmaxes), and the attention mass on that span (``span_mass``) and on the source token
  (``source_mass``). Roles: ``copy`` = a retrieval head whose in-span argmaxes mostly hit
  (``min_copy_precision``); ``locator`` = any other head whose argmax is in the span on most answer
  steps (``min_in_span``).

- Reach: besides the task's probes, *echo* probes (probes/near.py) state the answer again a few tokens
  before it is asked, so a sliding-window head can reach a copy source. Every head records the
  answer steps whose source lay inside its window (``reach_steps``) and its score over those alone
  (``reach_score``): where retrieval heads lie is compared among heads that could reach a source.

Only attention mixers (full, sliding-window and head-wise) are scored, each head in its own window (its record's
``window``: a head-wise layer's full heads have none); other layers are reported as not applicable. Attention
rows are computed only for the answer steps: while the model runs in pieces, forward pre-hooks keep each
attention layer's keys (all positions where a head is full, the last W-1 before the answer for a window of W)
and its queries at the answer rows; then those queries meet
the keys (B x H x answer x T scores, never T x T). Memory: a second copy of the full-attention KV
cache's keys.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import torch

from hybrid_lightning import records
from hybrid_lightning.config import EvalConfig
from hybrid_lightning.eval.runner import SumTable, probe_batches
from hybrid_lightning.eval.scoring import STATS, evaluating, score_samples
from hybrid_lightning.model.attention import attention_probs, causal_mask
from hybrid_lightning.model.mixers.attention import Attention
from hybrid_lightning.model.observe import attention_layers
from hybrid_lightning.probes.near import make_probe
from hybrid_lightning.probes.tasks import GenContext, Sample

# Per (layer, head) sums over samples: per-sample means over answer steps of hits, token hits,
# in-span argmaxes, span mass, source mass; then the pooled counts of hits, in-span argmaxes, answer
# steps, and answer steps with a copy source inside the head's window (``reach``).
HEAD_STATS = ("score", "token_score", "in_span", "span_mass", "source_mass", "hits", "in_span_steps", "steps",
              "reach_steps")
# Per-evaluation sums: samples, samples kept by the filter, exact matches, answer tokens, correct ones.
SAMPLE_STATS = ("samples", "kept", "exact", "answer_tokens", "correct")


class _Capture:
    """Forward pre-hook on an attention mixer: while the model runs in pieces, projects the mixer's
    inputs as the mixer does (positions, QK-norm, autocast) and keeps the keys at positions >= ``lo``
    and the queries at positions >= ``qlo``. Projecting inside the forward also works where weights
    are only whole during it (FSDP)."""

    def __init__(self, lo: int, qlo: int):
        self.lo, self.qlo, self.q, self.k = lo, qlo, [], []

    def __call__(self, module: Attention, args) -> None:
        x, state = args[0], args[1] if len(args) > 1 else None
        start = state.get("pos", 0) if state is not None else 0
        skip = max(0, self.lo - start)
        if skip >= x.shape[1]:
            return
        q, k, _ = module.project(x[:, skip:], start + skip)  # (B, H, t, Dh), (B, Hkv, t, Dh)
        self.k.append(k)
        self.q.append(q[:, :, max(0, self.qlo - start - skip) :])

    def keys(self) -> torch.Tensor:
        return torch.cat(self.k, dim=2)  # (B, Hkv, T - lo, Dh)

    def queries(self) -> torch.Tensor:
        return torch.cat(self.q, dim=2)  # (B, H, T - qlo, Dh)


def answer_targets(s: Sample, qlo: int, nq: int, n: int) -> tuple[np.ndarray, ...]:
    """What each answer row of ``s`` should look at, for rows at positions qlo ... qlo+nq-1 (position
    p predicts token p+1) over key positions 0 ... n-1. Returns ``valid`` (nq,): the row predicts an
    answer token copied from the prompt; ``source``, ``span``, ``token`` (nq, n): the positions the
    token is copied from (every statement of its value), the spans of those statements, and needle
    positions holding the same token (Wu et al.'s test)."""
    P = len(s.prompt)
    valid = np.zeros(nq, bool)
    source, span, token = (np.zeros((nq, n), bool) for _ in range(3))
    needle = np.zeros(n, bool)
    for a, b in s.needle_spans:
        needle[a:b] = True
    keys = np.full(n, -1, np.int64)
    keys[:P] = s.prompt
    starts = {}  # value span -> start of every statement of that value in the prompt
    for a, b in s.value_spans:
        windows = np.lib.stride_tricks.sliding_window_view(s.prompt, b - a)
        starts[(a, b)] = np.flatnonzero((windows == s.prompt[a:b]).all(axis=1))
    for j, src in enumerate(s.answer_source.tolist()):
        if src < 0:
            continue  # a separator between values: nothing to copy
        r = P - 1 + j - qlo
        (a, b), = [(a, b) for a, b in s.value_spans if a <= src < b]
        valid[r] = True
        for st in starts[(a, b)]:
            source[r, st + src - a] = True
            span[r, st : st + b - a] = True
        token[r] = needle & (keys == s.answer[j])
    return valid, source, span, token


def head_stats(probs: torch.Tensor, valid: torch.Tensor, source: torch.Tensor, span: torch.Tensor,
               token: torch.Tensor, reach: torch.Tensor) -> torch.Tensor:
    """Per-sample ``HEAD_STATS`` (B, H, len(HEAD_STATS)) float64 from the attention rows of the answer.

    Args:
        probs: (B, H, nq, nk) attention weights of the answer rows over the keys.
        valid: (B, nq) rows that predict a copied answer token.
        source, span, token: (B, nq, nk) targets of each row (``answer_targets``).
        reach: (B, H, nq) valid rows with a copy source each head can see (``head_reach``).
    """
    H = probs.shape[1]
    top = probs.argmax(dim=-1, keepdim=True)  # (B, H, nq, 1); ties go to the first position

    def at_top(mask: torch.Tensor) -> torch.Tensor:  # (B, nq, nk) -> (B, H, nq): the argmax is in mask
        return mask[:, None].expand(-1, H, -1, -1).gather(-1, top).squeeze(-1)

    v = valid[:, None].double()  # (B, 1, nq)
    n = valid.sum(dim=1).clamp(min=1).double()[:, None]  # (B, 1)
    hits, in_span = (at_top(source) * v).sum(-1), (at_top(span) * v).sum(-1)  # (B, H)
    token_hits = (at_top(token) * v).sum(-1)
    span_mass = ((probs * span[:, None]).sum(-1).double() * v).sum(-1)
    source_mass = ((probs * source[:, None]).sum(-1).double() * v).sum(-1)
    steps = valid.sum(dim=1).double()[:, None].expand(-1, H)  # (B, H)
    reached = reach.sum(dim=-1).double()  # (B, H)
    return torch.stack([hits / n, token_hits / n, in_span / n, span_mass / n, source_mass / n, hits, in_span, steps,
                        reached], dim=-1)


def reachable(valid: torch.Tensor, source: torch.Tensor, window: int | None) -> torch.Tensor:
    """(B, nq) bool: answer rows (``valid``, (B, nq)) with a copy source (``source``, (B, nq, nk) over
    the last nk key positions, the rows being the last nq) within ``window`` of the row."""
    allowed = causal_mask(source.shape[1], source.shape[2], window, source.device)  # (nq, nk)
    return valid & (source & allowed).any(dim=-1)


def head_reach(valid: torch.Tensor, source: torch.Tensor, windows: tuple[int | None, ...]) -> torch.Tensor:
    """(B, H, nq) bool: ``reachable`` for each head in its own window (``windows``, (H,): ``Attention.head_windows``;
    a head-wise layer's differ)."""
    by_window = {w: reachable(valid, source, w) for w in dict.fromkeys(windows)}
    return torch.stack([by_window[w] for w in windows], dim=1)


def head_probs(q: torch.Tensor, k: torch.Tensor, windows: tuple[int | None, ...]) -> torch.Tensor:
    """``attention_probs`` (B, H, nq, nk) of queries q (B, H, nq, Dh) over keys k (B, Hkv, nk, Dh) with each head
    in its own window (``windows``, (H,))."""
    probs = None
    for w in dict.fromkeys(windows):
        mine = attention_probs(q, k, w)  # (B, H, nq, nk), every head in window w
        heads = torch.tensor([hw == w for hw in windows], device=q.device).view(1, -1, 1, 1)
        probs = mine if probs is None else torch.where(heads, mine, probs)
    return probs


class RetrievalHeads:
    """The retrieval-head probes of an ``eval:`` config (its ``heads`` section), scored by ``run``.

    Args:
        cfg: the ``eval:`` section (``eval.heads`` plus the shared seed, batch size and chunk).
        tokenizer: the run's tokenizer.
        held_out: held-out token stream (essay haystacks).
    """

    def __init__(self, cfg: EvalConfig, tokenizer, held_out: np.ndarray):
        self.cfg, h = cfg, cfg.heads
        self.ctx = GenContext(tokenizer, held_out, h.value_tokens, cfg.vt_example)
        # echo probes (probes/near.py) at the middle depth only: the echo, not the needle, is their near source
        echo_depths = [h.depths[len(h.depths) // 2]] if h.echo else []
        self.specs = [(t, n, d, i, e) for n in h.lengths for t in h.tasks
                      for e, depths in ((False, h.depths), (True, echo_depths)) for d in depths
                      for i in range(h.samples)]

    @torch.no_grad()
    def run(self, model, *, step: int, tokens: int, dtype: torch.dtype | None = None, rank: int = 0,
            world: int = 1) -> dict:
        """Scores every attention head of ``model`` (a ``HybridLM``); returns the report (see ``report``).
        The arguments are ``LongContextEval.run``'s: step of the last training batch, training tokens
        seen, autocast dtype (None = the model's precision), this process's rank and the process count."""
        device = next(model.parameters()).device
        heads = SumTable(len(model.layers) * model.opts.n_heads, len(HEAD_STATS)).to(device)
        samples = SumTable(1, len(SAMPLE_STATS)).to(device)
        with evaluating(model):
            for _, probes, weight in probe_batches(self.specs, self.ctx, self.cfg.batch_size, self.cfg.seed, rank,
                                                     world, device, make_probe):
                self._score(model, probes, weight, dtype, device, heads, samples)
        # every rank reaches these computes (they all-reduce); a table nobody updated stays zero
        totals = [m.compute().cpu() if m.update_count else m.total.cpu() for m in (heads, samples)]
        return self.report(model, *totals, step, tokens)

    def _score(self, model, probes: list[Sample], weight: torch.Tensor, dtype, device, heads: SumTable,
               samples: SumTable) -> None:
        """One batch of equal-length probes: one teacher-forced forward with the attention queries and keys
        captured, then the answer rows of every attention layer."""
        L = len(probes[0].prompt) + len(probes[0].answer)
        qlo = min(len(s.prompt) for s in probes) - 1  # the first row that predicts an answer token
        nq = L - 1 - qlo
        layers = attention_layers(model)
        captures = [_Capture(0 if m.window is None else max(0, qlo - m.window + 1), qlo) for _, m in layers]
        hooks = [m.register_forward_pre_hook(c) for (_, m), c in zip(layers, captures)]
        try:
            stats, _ = score_samples(model, probes, self.cfg.chunk_tokens, dtype, None, device)  # (B, len(STATS))
        finally:
            for hook in hooks:
                hook.remove()
        s = dict(zip(STATS, stats.T))
        floor = self.cfg.heads.min_answer_accuracy
        kept = torch.ones_like(weight) if floor is None else (s["correct"] / s["tokens"] > floor).double()
        samples.update(torch.zeros(1, dtype=torch.long), torch.stack([
            weight.sum(), (weight * kept).sum(), (weight * s["exact"]).sum(), (weight * s["tokens"]).sum(),
            (weight * s["correct"]).sum()])[None])
        targets = [answer_targets(p, qlo, nq, L - 1) for p in probes]
        valid, source, span, token = (torch.from_numpy(np.stack(t)).to(device) for t in zip(*targets))
        H = model.opts.n_heads
        for (index, mixer), capture in zip(layers, captures):
            probs = head_probs(capture.queries(), capture.keys(), mixer.head_windows)  # (B, H, nq, nk)
            seen = source[..., capture.lo :]
            per = head_stats(probs, valid, seen, span[..., capture.lo :], token[..., capture.lo :],
                             head_reach(valid, seen, mixer.head_windows))
            heads.update(index * H + torch.arange(H), (per * (weight * kept)[:, None, None]).sum(dim=0))

    def report(self, model, heads: torch.Tensor, samples: torch.Tensor, step: int, tokens: int) -> dict:
        """The tidy report: one row per attention head, one per layer (non-attention layers marked not
        applicable), and totals. Scores are None when no sample was kept."""
        h, H = self.cfg.heads, model.opts.n_heads
        n = dict(zip(SAMPLE_STATS, samples[0].tolist()))
        scored = {i for i, _ in attention_layers(model)}
        rows = []
        for layer, head in itertools.product(sorted(scored), range(H)):
            t = dict(zip(HEAD_STATS, heads[layer * H + head].tolist()))
            spec = model.plan[layer]
            row = {"step": step, "tokens": tokens, "layer": layer, "head": head, "mixer": spec.mixer,
                   "window": model.layers[layer].mixer.head_windows[head], "pos": spec.pos}  # records.HeadScores
            if n["kept"]:
                row |= {k: t[k] / n["kept"] for k in ("score", "token_score", "in_span", "span_mass", "source_mass")}
                row["copy_precision"] = t["hits"] / t["in_span_steps"] if t["in_span_steps"] else None
            else:
                row |= dict.fromkeys(("score", "token_score", "in_span", "span_mass", "source_mass", "copy_precision"))
            # the score over the answer steps whose copy source the head can see (inside its window)
            row |= {"answer_steps": int(t["steps"]), "reach_steps": int(t["reach_steps"]),
                    "reach_score": t["hits"] / t["reach_steps"] if t["reach_steps"] else None}
            row["reach_retrieval"] = row["reach_score"] is not None and row["reach_score"] > h.threshold
            row["retrieval"] = row["score"] is not None and row["score"] > h.threshold
            copy = row["retrieval"] and (row["copy_precision"] or 0.0) >= h.min_copy_precision
            locator = not copy and row["in_span"] is not None and row["in_span"] >= h.min_in_span
            row["role"] = "copy" if copy else "locator" if locator else None
            rows.append(records.row("heads", **row))
        layers = []
        for spec in model.plan:
            mine = [r for r in rows if r["layer"] == spec.index]
            layers.append(records.row("layers", step=step, tokens=tokens, layer=spec.index, mixer=spec.mixer,
                                      window=spec.window, pos=spec.pos, applicable=spec.index in scored,
                                      **counts(mine, scored=spec.index in scored)))
        return {
            "step": step, "tokens": tokens, "settings": h.model_dump(mode="json"), "samples": int(n["samples"]),
            "kept": int(n["kept"]), "accuracy": n["exact"] / n["samples"] if n["samples"] else None,
            "token_accuracy": n["correct"] / n["answer_tokens"] if n["answer_tokens"] else None,
            "heads": rows, "layers": layers, "total": counts(rows, scored=bool(rows)),
        }


def counts(rows: list[dict], scored: bool = True) -> dict:
    """Retrieval, copy and locator head counts, the max and mean score of head rows, the heads that
    could see a copy source and those of them above the threshold there (None where nothing is
    scored: a layer that is not attention, or no sample kept)."""
    if not scored:
        return dataclasses.asdict(records.HeadCounts(*[None] * len(dataclasses.fields(records.HeadCounts))))
    scores = [r["score"] for r in rows if r["score"] is not None]
    return dataclasses.asdict(records.HeadCounts(
        retrieval_heads=sum(r["retrieval"] for r in rows),
        reaching_heads=sum(r["reach_steps"] > 0 for r in rows),  # heads that could see a copy source
        reach_retrieval_heads=sum(r["reach_retrieval"] for r in rows),
        copy_heads=sum(r["role"] == "copy" for r in rows),
        locator_heads=sum(r["role"] == "locator" for r in rows),
        max_score=max(scores) if scores else None,
        mean_score=sum(scores) / len(scores) if scores else None,
    ))
