"""LongPPL's key tokens as Fang et al. 2024 choose them (*What is Wrong with Perplexity for
Long-context Language Modeling?*, arXiv 2410.23771; PKU-ML/LongPPL ``find_key_token``): one fixed
evaluator model picks the key tokens of the held-out text once, and every model of a study is then
scored on those same tokens, so LongPPL compares models.

A token is key when the evaluator's loss on it drops markedly given the long context:
NLL(short) - NLL(long) > alpha (2 nats) and log p(long) > beta (-2). The short context is
K = ``eval.longppl_context`` to 2K-1 tokens (``scoring.short_context_nll``), so only tokens with at
least 2K tokens of context can be key tokens. The evaluator is ``eval.longppl_evaluator``: a run
directory (its newest valid checkpoint) or a checkpoint file of a run. The key tokens are cached
under ``<cache>/longppl/`` keyed by the evaluator checkpoint's SHA-256, the evaluation set's tokens,
K, alpha, beta and the autocast dtype.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hybrid_lightning.config import EvalConfig, RunConfig
from hybrid_lightning.eval.scoring import evaluating, short_context_nll, token_nll
from hybrid_lightning.fileio import write_atomic
from hybrid_lightning.rundir.checkpoints import find_resume_checkpoint, not_run_or_checkpoint
from hybrid_lightning.rundir.status import read_status

NO_EVALUATOR = "no evaluator model (eval.longppl_evaluator is null): key tokens are chosen by one model for all"


@dataclass(frozen=True)
class KeyTokens:
    """The key tokens of an evaluation set, or why there are none.

    Args:
        evaluator: the evaluator checkpoint (None without one).
        key: (sequences, T-1) bool, column p-1 marks the token at position p (as ``token_nll``); None
            when LongPPL is not reported.
        reason: why LongPPL is not reported (None when ``key`` is given).
    """

    evaluator: str | None
    key: np.ndarray | None
    reason: str | None = None


def scored_columns(length: int, context: int) -> np.ndarray:
    """(length,) bool over the ``token_nll`` columns of a sequence of ``length`` + 1 tokens: the
    tokens with at least 2K context (K = ``context``), the only ones that can be key tokens."""
    return np.arange(length) >= 2 * context - 1


@torch.no_grad()
def select_key_tokens(model, sequences: list[np.ndarray], cfg: EvalConfig, dtype: torch.dtype | None) -> np.ndarray:
    """Key tokens (sequences, T-1) bool of ``sequences`` (each (T,) token ids) chosen by ``model``."""
    device = next(model.parameters()).device
    out = []
    with evaluating(model):
        for i in range(0, len(sequences), cfg.batch_size):
            ids = torch.from_numpy(np.stack(sequences[i : i + cfg.batch_size])).to(device)  # (B, T)
            nll = token_nll(model, ids, cfg.chunk_tokens, dtype)[0]  # (B, T-1)
            # (B, T-1), NaN below 2K
            short = short_context_nll(model, ids, cfg.longppl_context, cfg.chunk_tokens, dtype, cfg.batch_size)
            out.append((~short.isnan() & (short - nll > cfg.longppl_alpha) & (-nll > cfg.longppl_beta)).cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0), bool)


def resolve_evaluator(spec: str) -> tuple[Path | None, str | None]:
    """(checkpoint, None) for ``eval.longppl_evaluator`` = a finished run's directory (its newest
    valid checkpoint) or a checkpoint file inside a run's ``checkpoints/``; (None, why) otherwise."""
    path = Path(spec)
    if (why := not_run_or_checkpoint(path)) is not None:
        return None, f"eval.longppl_evaluator: {why}"
    if path.is_file():
        return path, None
    if (read_status(path) or {}).get("state") != "done":  # its newest checkpoint would change under us
        return None, f"eval.longppl_evaluator: {spec} has not finished training"
    found = find_resume_checkpoint(path)
    if found is None:
        return None, f"eval.longppl_evaluator: {spec} has no valid checkpoint"
    return found[0], None


def load_model(ckpt: Path, device: torch.device) -> tuple[RunConfig, torch.nn.Module]:
    """The model of checkpoint ``ckpt`` (in ``<run>/checkpoints/``) with its run's config, in eval mode."""
    from hybrid_lightning.plan import load_trained
    from hybrid_lightning.plan.resolve import read_run

    cfg, plan = read_run(ckpt.parent.parent)
    model, _ = load_trained(plan, ckpt)
    return cfg, model.to(device).eval()


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cache_key(evaluator_digest: str, sequences: list[np.ndarray], cfg: EvalConfig, dtype: torch.dtype | None) -> str:
    """The cache entry's name: evaluator checkpoint, evaluation set (its tokens), K, alpha, beta, dtype."""
    h = hashlib.sha256(json.dumps([evaluator_digest, cfg.longppl_context, cfg.longppl_alpha, cfg.longppl_beta,
                                   str(dtype), len(sequences)]).encode())
    for s in sequences:
        h.update(np.ascontiguousarray(s, dtype=np.int64).tobytes())
    return h.hexdigest()[:32]


def evaluator_key_tokens(run: RunConfig, sequences: list[np.ndarray], device: torch.device,
                         dtype: torch.dtype | None = None) -> KeyTokens:
    """The key tokens of ``sequences`` chosen by ``run.eval.longppl_evaluator``, read from the cache
    (``cache_root(run.data)/longppl/``) or computed and written there. Without an evaluator, or with
    one that has no checkpoint yet (a grid cell still training), a ``KeyTokens`` with the reason.

    Args:
        run: the evaluated run's config (its ``eval:`` settings, tokenizer, vocabulary and cache).
        sequences: the evaluation set, each (T,) token ids.
        device, dtype: where the evaluator runs and its autocast dtype (part of the cache key).
    """
    from hybrid_lightning.data.corpus import cache_root

    cfg = run.eval
    if cfg.longppl_evaluator is None:
        return KeyTokens(None, None, NO_EVALUATOR)
    ckpt, reason = resolve_evaluator(cfg.longppl_evaluator)
    if ckpt is None:
        return KeyTokens(None, None, reason)
    path = cache_root(run.data) / "longppl" / f"{cache_key(file_digest(ckpt), sequences, cfg, dtype)}.npy"
    if path.is_file():
        return KeyTokens(str(ckpt), np.load(path))
    evaluator, model = load_model(ckpt, device)
    theirs, ours = (evaluator.data.tokenizer, evaluator.model.vocab_size), (run.data.tokenizer, run.model.vocab_size)
    if theirs != ours:
        raise ValueError(f"eval.longppl_evaluator: {ckpt} has tokenizer {theirs[0]!r} ({theirs[1]} tokens), this run "
                         f"{ours[0]!r} ({ours[1]} tokens); the evaluator must share the run's tokenizer")
    key = select_key_tokens(model, sequences, cfg, dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.save(buffer, key)
    write_atomic(path, buffer.getvalue())  # ranks may write at once: each through its own temporary
    return KeyTokens(str(ckpt), key)
