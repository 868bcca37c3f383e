"""What a run will cost before it runs (``train --dry-run``, ``grid submit --dry-run``): its tokens,
steps and an estimated time from a throughput measured here, on a few optimizer steps of the run's
own model on random tokens. Nothing is written: no run directory, no token store, no cache."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from hybrid_lightning.config import ModelConfig, RunConfig
from hybrid_lightning.design import build_model
from hybrid_lightning.precision import autocast_dtype, resolve_precision
from hybrid_lightning.rundir import find_resume_checkpoint

MEASURED_STEPS = 2  # timed optimizer steps, after one untimed step (allocations, lazy initialisation)
MEASURED_TOKENS = 4096  # at most this many tokens per measured step: the run's batch, cut to fit (one sequence at least)


@dataclass(frozen=True)
class Estimate:
    """A run's size and its training time at ``tokens_per_s`` (measured on ``device`` with ``batch``
    sequences per step; where that is below the run's batch, a larger batch is faster per token and
    the time an upper bound). Evaluations during training are not counted."""

    steps: int
    tokens: int
    tokens_per_s: float
    batch: int
    device: str

    @property
    def seconds(self) -> float:
        return self.tokens / self.tokens_per_s

    def describe(self) -> str:
        return (f"{self.steps:,} steps, {self.tokens:,} tokens; measured {self.tokens_per_s:,.0f} tokens/s on "
                f"{self.device} (batch {self.batch}, {MEASURED_STEPS} steps) -> about {duration(self.seconds)} of training "
                "(evaluations not counted)")


def dry_run_report(cfg: RunConfig, run_dir: Path) -> str:
    """Two lines on the resolved run ``cfg``: its size and estimated time, and its run directory."""
    resume = find_resume_checkpoint(run_dir)
    where = f"run directory {run_dir}" + (f" (resumes at step {resume[1]})" if resume else " (new)")
    return f"{cfg.name}: {estimate(cfg).describe()}\n{where}; nothing written"


def duration(seconds: float) -> str:
    """``95`` -> ``1 min 35 s``; ``7300`` -> ``2.0 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    return f"{seconds / 3600:.1f} h"


def estimate(cfg: RunConfig) -> Estimate:
    """The resolved run ``cfg``'s steps, tokens and training time (see ``MEASURED_TOKENS``)."""
    device = "cuda" if cfg.train.accelerator != "cpu" and torch.cuda.is_available() else "cpu"
    batch = max(1, min(cfg.train.batch_size, MEASURED_TOKENS // cfg.train.seq_len))
    precision = resolve_precision(cfg.train, cfg.model)
    rate = measure(cfg.model, batch, cfg.train.seq_len, device, precision)  # one device; each trains its own batch
    return Estimate(cfg.train.max_steps, cfg.train.planned_tokens(), rate * cfg.train.planned_world_size(), batch, device)


@functools.cache
def measure(model_cfg: ModelConfig, batch: int, seq_len: int, device: str, precision: str) -> float:
    """Training tokens/s of one device: forward, loss, backward and an AdamW step on random tokens
    (B, T) = (batch, seq_len), over ``MEASURED_STEPS`` steps after a first untimed one."""
    model = build_model(model_cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model_cfg.vocab_size, (batch, seq_len + 1), device=device)  # (B, T + 1)
    dtype = autocast_dtype(precision)

    def step() -> None:
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            logits = model(tokens[:, :-1]).float()  # (B, T, V)
        F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(MEASURED_STEPS):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return MEASURED_STEPS * batch * seq_len / (time.perf_counter() - start)
