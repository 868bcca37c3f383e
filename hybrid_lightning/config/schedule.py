"""The learning-rate schedule as a function of the step and the train section: training follows it
(training/system.py) and a resume checks that a changed ``train.max_steps`` keeps it for the steps
already trained (training/resume.check_extension)."""

from __future__ import annotations

import math

from hybrid_lightning.config.schema import TrainConfig


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier on train.lr at optimizer step ``step`` (0-based)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    floor = cfg.min_lr_ratio
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "cosine":
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    # WSD (warmup, stable, decay): constant, then linear decay over the last decay_fraction of steps.
    start = decay_start(cfg)
    if step < start:
        return 1.0
    return 1.0 - (1 - floor) * min(1.0, (step - start + 1) / (cfg.max_steps - start))


def decay_start(cfg: TrainConfig) -> int:
    """WSD's first decaying step (0-based): the last ``decay_fraction`` of ``max_steps``, at least one step. Before
    it the learning rate does not depend on ``max_steps``: the stable phase a budget's branch shares."""
    return cfg.max_steps - max(1, round(cfg.decay_fraction * cfg.max_steps))
