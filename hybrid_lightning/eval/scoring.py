"""Teacher-forced and generation scoring, fed in pieces with the model's incremental states.

Exact match of the whole answer under greedy decoding is computed by teacher forcing: the
prompt and the answer are fed together and every answer token must be the argmax of the
logits before it. The two are equivalent (all answer tokens argmax-correct <=> the greedy
continuation starts with the answer) and teacher forcing needs one forward instead of one
per generated token. The same forward gives the graded measures: per-token answer accuracy
and answer loss (mean negative log-likelihood per answer token, nats).

The generation score is RULER's (Hsieh et al. 2024, NVIDIA/RULER ``scripts/eval``): greedy
decoding of the task's budget of new tokens (``Sample.generate_tokens``) after the prompt,
the output decoded to text and scored with ``string_match_all`` (the share of the reference
values found in it, case-insensitive) and ``string_match_part`` (1 if any is found), so values
count in any order and anywhere in the output. Decoding continues from a copy of the state the
teacher-forced pass reaches at the end of the batch's shortest prompt (the prompt is fed once;
the copy holds a second KV cache of the full-attention layers), one token per call for the whole
batch: rows with longer prompts feed their own prompt tokens until they end.

Long inputs go through the model in pieces of ``chunk`` tokens with ``model.new_states()``:
full-attention layers keep their KV cache, sliding-window layers only their last W-1 keys,
so memory grows with the full-attention layers alone and the logits of one piece at a time.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from hybrid_lightning.probes.tasks import Sample

# Per-sample statistics summed into cells: samples, exact matches, answer tokens, correct answer
# tokens, answer NLL (nats), chance NLL (nats, -log P(answer) under the value prior), the answer tokens a
# format-only predictor gets right (expected; probes/chance.py), distance (tokens from the needle value to
# the first answer prediction); then samples with a generation, generations that start with the answer,
# RULER's string_match_all and string_match_part.
STATS = ("n", "exact", "tokens", "correct", "nll", "chance_nll", "chance_correct", "distance", "generated", "gen_exact",
         "match_all", "match_part")


def autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


@contextlib.contextmanager
def evaluating(model: torch.nn.Module):
    """``model`` in eval mode for the block; its training mode restored after it, an exception included."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def ruler_output(text: str) -> str:
    """RULER's post-processing of a generated text: stripped, control characters made newlines."""
    return re.sub(r"[\x00-\x1f]", "\n", text.strip()).strip()


def string_match_all(output: str, references: list[str]) -> float:
    """RULER's ``string_match_all`` of one output: the share of ``references`` it contains (case-insensitive)."""
    out = output.lower()
    return sum(r.lower() in out for r in references) / len(references)


def string_match_part(output: str, references: list[str]) -> float:
    """RULER's ``string_match_part`` of one output: 1.0 if it contains any of ``references`` (case-insensitive)."""
    out = output.lower()
    return float(any(r.lower() in out for r in references))


def _agree(value: int, op: dist.ReduceOp, device: torch.device) -> int:
    """``value`` reduced over the ranks of a running process group (else itself): the ranks feed the
    model alike, as sharded models need."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], device=device)
    dist.all_reduce(t, op)
    return int(t.item())


def _feed(model, states: list[dict], x: torch.Tensor, y: torch.Tensor, chunk: int,
          dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Feeds x (B, t) in pieces of ``chunk`` through ``states``; position i predicts y[:, i]. Returns
    (nll (B, t) float32, argmax-correct (B, t) bool, logits of the last position (B, V) or None if t = 0)."""
    nll, correct, last = [], [], None
    for s in range(0, x.shape[1], chunk):
        with autocast(x.device, dtype):
            logits = model(x[:, s : s + chunk], states)  # (B, c, V)
        logits, target = logits.float(), y[:, s : s + chunk]
        nll.append(F.cross_entropy(logits.transpose(1, 2), target, reduction="none"))
        correct.append(logits.argmax(dim=-1) == target)
        last = logits[:, -1]
    if not nll:
        return x.new_zeros(x.shape, dtype=torch.float32), x.new_zeros(x.shape, dtype=torch.bool), None
    return torch.cat(nll, dim=1), torch.cat(correct, dim=1), last


@torch.no_grad()
def token_nll(model, ids: torch.Tensor, chunk: int,
              dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Position t predicts ids[:, t+1]. Returns (nll (B, T-1) float32, argmax-correct (B, T-1) bool).

    Args:
        model: a ``HybridLM`` (or anything with ``new_states()`` and ``forward(ids, states)``).
        ids: (B, T) token ids.
        chunk: tokens fed per forward call; states carry the context between calls.
        dtype: autocast dtype (None = the model's own precision).
    """
    return _feed(model, model.new_states(), ids[:, :-1], ids[:, 1:], chunk, dtype)[:2]


@torch.no_grad()
def greedy(model, states: list[dict], logits: torch.Tensor, prompts: torch.Tensor, lengths: torch.Tensor, start: int,
           end: int, dtype: torch.dtype | None) -> torch.Tensor:
    """Greedy decoding of a batch whose prompts have different lengths, from ``states`` after the
    first ``start`` tokens and the ``logits`` (B, V) of position start - 1.

    Every call feeds one position for all rows: row b feeds its prompt token while the position is
    below ``lengths[b]``, else the argmax of its previous logits. Returns the tokens (B, end) of
    positions 0 ... end-1 (prompt tokens where the prompt has them, generated ones after).

    Args:
        prompts: (B, >= max(lengths)) token ids, each row's prompt first.
        lengths: (B,) prompt lengths, each >= ``start``.
        end: positions to fill.
    """
    out = torch.zeros(prompts.shape[0], end, dtype=torch.long, device=prompts.device)
    out[:, :start] = prompts[:, :start]
    for t in range(start, end):
        nxt = logits.argmax(dim=-1)  # (B,): the prediction for position t
        out[:, t] = torch.where(lengths > t, prompts[:, min(t, prompts.shape[1] - 1)], nxt)
        if t + 1 < end:
            with autocast(prompts.device, dtype):
                logits = model(out[:, t : t + 1], states)[:, -1].float()  # (B, V)
    return out


def _fork(states: list[dict]) -> list[dict]:
    """A copy of the models' states that the original's later updates leave alone."""
    return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()} for s in states]


def score_samples(model, samples: list[Sample], chunk: int, dtype: torch.dtype | None, window: int | None,
                  device: torch.device, tokenizer=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores equal-length samples in one batch: returns (stats (B, len(STATS)) float64, in_window (B,) bool).

    ``in_window`` is False for every sample when ``window`` is None (no sliding-window layer). With a
    ``tokenizer`` (its ``decode``) each sample is also generated and scored by string match; without
    one the generation statistics are 0.
    """
    ids = torch.from_numpy(np.stack([np.concatenate([s.prompt, s.answer]) for s in samples])).to(device)  # (B, L)
    x, y = ids[:, :-1], ids[:, 1:]  # (B, L-1)
    lengths = torch.tensor([len(s.prompt) for s in samples], device=device)
    states = model.new_states()
    if tokenizer is None:  # teacher-forced only: one pass, no fork and no agreement between ranks needed
        nll, correct, _ = _feed(model, states, x, y, chunk, dtype)  # (B, L-1)
    else:
        start = _agree(int(lengths.min()), dist.ReduceOp.MIN, device)  # generation forks after the shortest prompt
        nll0, correct0, logits = _feed(model, states, x[:, :start], y[:, :start], chunk, dtype)
        fork = _fork(states)
        nll1, correct1, _ = _feed(model, states, x[:, start:], y[:, start:], chunk, dtype)
        nll, correct = torch.cat([nll0, nll1], dim=1), torch.cat([correct0, correct1], dim=1)  # (B, L-1)
    mask = torch.arange(nll.shape[1], device=device)[None, :] >= lengths[:, None] - 1  # (B, L-1): the answer tail
    n_tok = mask.sum(dim=1)
    n_correct = (correct & mask).sum(dim=1)
    stats = torch.stack([
        torch.ones_like(n_tok), (n_correct == n_tok).long(), n_tok, n_correct,
    ], dim=1).double()
    extra = torch.tensor([[s.chance_nll, s.chance_correct, s.distance()] for s in samples], dtype=torch.float64,
                         device=device)
    gen = torch.zeros(len(samples), 4, dtype=torch.float64, device=device)
    if tokenizer is not None:
        gen = _generation_stats(model, fork, logits, ids, lengths, start, samples, tokenizer, dtype)
    stats = torch.cat([stats, (nll * mask).sum(dim=1, dtype=torch.float64)[:, None], extra, gen], dim=1)
    in_window = torch.tensor([window is not None and s.in_window(window) for s in samples], device=device)
    return stats, in_window


def _generation_stats(model, states, logits, ids, lengths, start, samples, tokenizer, dtype) -> torch.Tensor:
    """(B, 4) float64: generated, starts with the answer, string_match_all, string_match_part."""
    end = max(len(s.prompt) + s.generate_tokens for s in samples)
    end = start + _agree(end - start, dist.ReduceOp.MAX, ids.device)
    tokens = greedy(model, states, logits, ids, lengths, start, end, dtype).cpu().numpy()
    rows = []
    for s, row in zip(samples, tokens):
        out = row[len(s.prompt) : len(s.prompt) + s.generate_tokens]
        text = ruler_output(tokenizer.decode(out.tolist()))
        rows.append([1.0, float(np.array_equal(out[: len(s.answer)], s.answer)),
                     string_match_all(text, s.references), string_match_part(text, s.references)])
    return torch.tensor(rows, dtype=torch.float64, device=ids.device)


def position_buckets(length: int) -> list[tuple[int, int]]:
    """Log-spaced buckets [lo, hi) of the predicted token's position p (= tokens of context it has),
    p in 1 ... length: [1, 2), [2, 4), [4, 8), ..., the last one ending at length + 1."""
    out, lo = [], 1
    while lo <= length:
        hi = 2 * lo if 3 * lo <= length + 1 else length + 1  # no last bucket shorter than half the one before
        out.append((lo, hi))
        lo = hi
    return out


@torch.no_grad()
def short_context_nll(model, ids: torch.Tensor, context: int, chunk: int, dtype: torch.dtype | None,
                      batch: int) -> torch.Tensor:
    """NLL of every token of ids (B, T) seeing only a short context: tokens at positions p in
    [bK, (b+1)K) (K = ``context``) are predicted from positions (b-1)K ... p-1, i.e. from K to 2K-1
    tokens (Fang et al. 2024's truncated context with blocks as long as the context), ``batch``
    windows per forward. Returns (B, T-1) like ``token_nll``; positions p < 2K, where the short
    context is the whole context, are NaN."""
    B, T = ids.shape
    K = context
    out = torch.full((B, T - 1), float("nan"), device=ids.device)
    blocks = list(range(2, -(-T // K)))  # block b covers target positions [bK, (b+1)K)
    if not blocks:
        return out
    pad = (blocks[-1] + 1) * K - T
    padded = F.pad(ids, (0, max(0, pad)))
    windows = torch.cat([padded[:, (b - 1) * K : (b + 1) * K] for b in blocks])  # (nB * B, 2K)
    # window position t predicts t+1: keep the targets at window positions K ... 2K-1
    nll = torch.cat([token_nll(model, w, chunk, dtype)[0][:, K - 1 :] for w in windows.split(batch)])
    nll = nll.reshape(len(blocks), B, K)
    for i, b in enumerate(blocks):
        lo, hi = b * K, min((b + 1) * K, T)
        out[:, lo - 1 : hi - 1] = nll[i, :, : hi - lo]
    return out
