"""What a run will cost before it runs (``train --dry-run``, ``grid submit --dry-run``): its tokens, steps
and an estimated time from a throughput measured here, on optimizer steps of the run's own training step
(``LMSystem.training_step``: its model, precision, document masking and activation checkpointing) on random
tokens. Nothing is written: no run directory, no token store, no cache."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hybrid_lightning.config import RunConfig, config_to_dict
from hybrid_lightning.plan.precision import autocast_dtype
from hybrid_lightning.rundir.checkpoints import find_resume_checkpoint
from hybrid_lightning.runplan import RunPlan
from hybrid_lightning.training.threads import set_threads, thread_count

WARMUP_STEPS = 2  # untimed optimizer steps of each run first (allocations, lazy initialisation, a compilation)
# then timed rounds, one step of every run measured together in each: a run's median is its step time
MEASURED_STEPS = 7
# at most this many tokens per measured step: the run's batch, cut to fit (one sequence at least)
MEASURED_TOKENS = 4096
MEMORY_SHARE = 0.5  # of this machine's (or GPU's) memory, what the runs measured together may hold


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
    threads: int

    @property
    def seconds(self) -> float:
        return self.tokens / self.tokens_per_s

    def describe(self) -> str:
        threads = f", {self.threads} thread{'s' if self.threads > 1 else ''}" if self.device == "cpu" else ""
        return (f"{self.steps:,} steps, {self.tokens:,} tokens; measured {self.tokens_per_s:,.0f} tokens/s on "
                f"{self.device} (batch {self.batch}{threads}, median of {MEASURED_STEPS} steps) -> about "
                f"{duration(self.seconds)} of training (evaluations not counted)")


def dry_run_report(cfg: RunConfig, plan: RunPlan, run_dir: Path) -> str:
    """Lines on the resolved run ``cfg`` and its plan: its size and estimated time, its precision and fast paths
    (with their notes), and its run directory."""
    resume = find_resume_checkpoint(run_dir)
    where = f"run directory {run_dir}" + (f" (resumes at step {resume[1]})" if resume else " (new)")
    kernels = f"{plan.precision}, {plan.describe_kernels()}"
    return f"{cfg.name}: {estimate(cfg, plan).describe()}\n{kernels}\n{where}; nothing written"


def duration(seconds: float) -> str:
    """``95`` -> ``1 min 35 s``; ``7300`` -> ``2.0 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    return f"{seconds / 3600:.1f} h"


def estimate(cfg: RunConfig, plan: RunPlan) -> Estimate:
    """The resolved run's steps, tokens and training time (``estimates``)."""
    return estimates([(cfg, plan)])[0]


def estimates(runs: list[tuple[RunConfig, RunPlan]]) -> list[Estimate]:
    """The steps, tokens and training time of each resolved run and its plan. Runs whose training step is the same
    (``_step_key``: neither name, seed, steps nor evaluation settings change it) are measured once; the others are
    measured together, ``MEASURED_STEPS`` rounds of one step of each, so that a machine whose load changes
    meanwhile slows every run alike and equal runs get equal estimates (in groups of as many as
    ``MEMORY_SHARE`` of the memory holds, by their plans' estimates)."""
    device = "cuda" if any(cfg.train.accelerator != "cpu" for cfg, _ in runs) and torch.cuda.is_available() else "cpu"
    keys = [_step_key(cfg, plan) for cfg, plan in runs]
    distinct = {key: (cfg, plan) for key, (cfg, plan) in zip(keys, runs)}
    rates: dict[str, float] = {}
    for group in _groups(list(distinct.items()), device):
        rates |= _measure_together(group, device)
    out = []
    for key, (cfg, plan) in zip(keys, runs):
        b = plan.budget
        out.append(Estimate(b.max_steps, b.tokens, rates[key] * b.world_size, _batch(cfg), device,
                            thread_count(cfg.train)))
    return out  # one device each: its own batch


def _batch(cfg: RunConfig) -> int:
    return max(1, min(cfg.train.batch_size, MEASURED_TOKENS // cfg.train.seq_len))


def _step_key(cfg: RunConfig, plan: RunPlan) -> str:
    """What a measured step depends on, as JSON: the config but its name, seed, length and evaluations, at the
    measured batch, and the plan."""
    raw = {**config_to_dict(cfg), "name": None, "seed": 0, "eval": None}
    raw["train"] = {**raw["train"], "max_steps": None, "tokens_per_param": None, "batch_size": _batch(cfg)}
    return json.dumps([raw, {**plan.as_dict(), "budget": None, "probes": None}], sort_keys=True)


def _groups(runs: list[tuple[str, tuple[RunConfig, RunPlan]]],
            device: str) -> list[list[tuple[str, tuple[RunConfig, RunPlan]]]]:
    """``runs`` in groups whose plans' memory estimates together stay within ``MEMORY_SHARE`` of the device's."""
    from hybrid_lightning.plan.memory import machine_memory

    groups: list[list] = []
    budget, held = MEMORY_SHARE * machine_memory(runs[0][1][0])[0], 0
    for item in runs:
        need = item[1][1].memory_estimate.peak()
        if not groups or held + need > budget:
            groups.append([])
            held = 0
        groups[-1].append(item)
        held += need
    return groups


def _measure_together(group: list[tuple[str, tuple[RunConfig, RunPlan]]], device: str) -> dict[str, float]:
    """Training tokens/s of one device for each run of ``group`` (key -> rate): ``WARMUP_STEPS`` untimed steps of
    each, then ``MEASURED_STEPS`` rounds of one timed step of each in turn; the median of each run's."""
    steps = {key: _training_step(cfg, plan, device) for key, (cfg, plan) in group}
    for step in steps.values():
        for _ in range(WARMUP_STEPS):
            step()
    times: dict[str, list[float]] = {key: [] for key in steps}
    for _ in range(MEASURED_STEPS):
        for key, step in steps.items():
            times[key].append(step())
    return {key: _batch(cfg) * cfg.train.seq_len / statistics.median(times[key]) for key, (cfg, _) in group}


def _training_step(cfg: RunConfig, plan: RunPlan, device: str) -> Callable[[], float]:
    """A function that runs one optimizer step of the run (its ``LMSystem.training_step`` and AdamW, at the measured
    batch, on random tokens, under the run's threads and precision) and returns its seconds."""
    from hybrid_lightning.training.system import LMSystem

    raw = config_to_dict(cfg)
    raw["train"] = {**raw["train"], "max_steps": 1, "tokens_per_param": None, "batch_size": _batch(cfg)}
    system = LMSystem(raw, plan.as_dict()).to(device)
    opt = system.configure_optimizers()["optimizer"]
    tokens = torch.randint(0, cfg.model.vocab_size, (_batch(cfg), cfg.train.seq_len + 1), device=device)  # (B, T + 1)
    dtype = autocast_dtype(plan.precision)

    def step() -> float:
        set_threads(cfg.train)
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

    return step
