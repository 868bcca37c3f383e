"""What a run will cost before it runs (``train --dry-run``, ``grid submit --dry-run``): its tokens, steps
and an estimated time from a throughput measured here, on optimizer steps of the run's own training step
(``LMSystem.training_step``: its model, precision, document masking and activation checkpointing) on random
tokens. Nothing is written: no run directory, no token store, no cache."""

from __future__ import annotations

import functools
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hybrid_lightning.config import RunConfig, config_to_dict
from hybrid_lightning.plan.precision import autocast_dtype
from hybrid_lightning.rundir import find_resume_checkpoint
from hybrid_lightning.runplan import RunPlan

WARMUP_STEPS = 1  # untimed optimizer steps first (allocations, lazy initialisation, a compilation)
MEASURED_STEPS = 5  # then timed ones, each alone: the median is the step time (one slow step does not move it)
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
                f"{self.device} (batch {self.batch}, median of {MEASURED_STEPS} steps) -> about {duration(self.seconds)} "
                "of training (evaluations not counted)")


def dry_run_report(cfg: RunConfig, plan: RunPlan, run_dir: Path) -> str:
    """Two lines on the resolved run ``cfg`` and its plan: its size and estimated time, and its run directory."""
    resume = find_resume_checkpoint(run_dir)
    where = f"run directory {run_dir}" + (f" (resumes at step {resume[1]})" if resume else " (new)")
    return f"{cfg.name}: {estimate(cfg, plan).describe()}\n{where}; nothing written"


def duration(seconds: float) -> str:
    """``95`` -> ``1 min 35 s``; ``7300`` -> ``2.0 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    return f"{seconds / 3600:.1f} h"


def estimate(cfg: RunConfig, plan: RunPlan) -> Estimate:
    """The resolved run's steps, tokens and training time (see ``MEASURED_TOKENS``)."""
    device = "cuda" if cfg.train.accelerator != "cpu" and torch.cuda.is_available() else "cpu"
    batch = max(1, min(cfg.train.batch_size, MEASURED_TOKENS // cfg.train.seq_len))
    # what the step's time depends on: neither the run's name and seed nor its length (a grid's equal cells measure once)
    raw = {**config_to_dict(cfg), "name": None, "seed": 0}
    raw["train"] = {**raw["train"], "max_steps": None, "batch_size": batch}
    rate = measure(json.dumps(raw, sort_keys=True), json.dumps(plan.as_dict(), sort_keys=True), device)
    b = plan.budget
    return Estimate(b.max_steps, b.tokens, rate * b.world_size, batch, device)  # one device each: its own batch


@functools.cache
def measure(config: str, plan: str, device: str) -> float:
    """Training tokens/s of one device running the training step of the run ``config`` (JSON, its
    ``train.batch_size`` the measured batch) with its plan (JSON), and an AdamW step, on random tokens: the median
    of ``MEASURED_STEPS`` steps timed alone, after ``WARMUP_STEPS``."""
    from hybrid_lightning.training.system import LMSystem

    raw, planned = json.loads(config), json.loads(plan)
    raw["train"]["max_steps"] = 1
    system = LMSystem(raw, planned).to(device)
    opt = system.configure_optimizers()["optimizer"]
    t = system.cfg.train
    tokens = torch.randint(0, system.cfg.model.vocab_size, (t.batch_size, t.seq_len + 1), device=device)  # (B, T + 1)
    dtype = autocast_dtype(planned["precision"])

    def step() -> float:
        start = time.perf_counter()
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            loss = system.training_step(tokens, 0)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        system._step_losses.clear()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for _ in range(WARMUP_STEPS):
        step()
    return tokens[:, :-1].numel() / statistics.median(step() for _ in range(MEASURED_STEPS))
