"""Teacher-forced scoring, fed in pieces with the model's incremental states.

Exact match of the whole answer under greedy decoding is computed by teacher forcing: the
prompt and the answer are fed together and every answer token must be the argmax of the
logits before it. The two are equivalent (all answer tokens argmax-correct <=> the greedy
continuation starts with the answer) and teacher forcing needs one forward instead of one
per generated token. The same forward gives the graded measures: per-token answer accuracy
and answer loss (mean negative log-likelihood per answer token, nats).

Long inputs go through the model in pieces of ``chunk`` tokens with ``model.new_states()``:
full-attention layers keep their KV cache, sliding-window layers only their last W-1 keys,
so memory grows with the full-attention layers alone and the logits of one piece at a time.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F

from hybrid_lightning.eval.tasks import Sample

# Per-sample statistics summed into cells: samples, exact matches, answer tokens, correct answer
# tokens, answer NLL (nats), chance NLL (nats, -log P(answer) under the value prior), distance
# (tokens from the needle value to the first answer prediction).
STATS = ("n", "exact", "tokens", "correct", "nll", "chance_nll", "distance")


def autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


@torch.no_grad()
def token_nll(model, ids: torch.Tensor, chunk: int, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Position t predicts ids[:, t+1]. Returns (nll (B, T-1) float32, argmax-correct (B, T-1) bool).

    Args:
        model: a ``HybridLM`` (or anything with ``new_states()`` and ``forward(ids, states)``).
        ids: (B, T) token ids.
        chunk: tokens fed per forward call; states carry the context between calls.
        dtype: autocast dtype (None = the model's own precision).
    """
    x, y = ids[:, :-1], ids[:, 1:]  # (B, T-1)
    states = model.new_states()
    nll, correct = [], []
    for s in range(0, x.shape[1], chunk):
        with autocast(ids.device, dtype):
            logits = model(x[:, s : s + chunk], states)  # (B, t, V)
        logits, target = logits.float(), y[:, s : s + chunk]
        nll.append(F.cross_entropy(logits.transpose(1, 2), target, reduction="none"))
        correct.append(logits.argmax(dim=-1) == target)
    return torch.cat(nll, dim=1), torch.cat(correct, dim=1)


def score_samples(model, samples: list[Sample], chunk: int, dtype: torch.dtype | None, window: int | None,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores equal-length samples in one batch: returns (stats (B, len(STATS)) float64, in_window (B,) bool).

    ``in_window`` is False for every sample when ``window`` is None (no sliding-window layer).
    """
    ids = torch.from_numpy(np.stack([np.concatenate([s.prompt, s.answer]) for s in samples])).to(device)  # (B, L)
    nll, correct = token_nll(model, ids, chunk, dtype)  # (B, L-1)
    starts = torch.tensor([len(s.prompt) - 1 for s in samples], device=device)  # first answer-predicting position
    mask = torch.arange(nll.shape[1], device=device)[None, :] >= starts[:, None]  # (B, L-1): the answer tail
    n_tok = mask.sum(dim=1)
    n_correct = (correct & mask).sum(dim=1)
    stats = torch.stack([
        torch.ones_like(n_tok), (n_correct == n_tok).long(), n_tok, n_correct,
    ], dim=1).double()
    extra = torch.tensor([[s.chance_nll, s.distance()] for s in samples], dtype=torch.float64, device=device)
    stats = torch.cat([stats, (nll * mask).sum(dim=1, dtype=torch.float64)[:, None], extra], dim=1)
    in_window = torch.tensor([window is not None and s.in_window(window) for s in samples], device=device)
    return stats, in_window


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
