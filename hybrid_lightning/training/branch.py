"""Budgets as decay branches of one stable phase (``train.stable_phase``; docs/grids.md, Budgets as branches).

Under WSD the learning rate before a run's decay start does not depend on ``train.max_steps``
(``config.schedule.decay_start``), and the batches are a pure function of (seed, step) (``data.datamodule``): the
checkpoint at step s of any run of the same model, data and seed whose decay starts after s is, in weights, optimizer
state and data position, the checkpoint a run decaying from s would have written at s itself. So a run publishes its
checkpoint at the shorter budgets' decay starts (``train.stable_phase.publish``: ``StepCheckpoints`` hard-links it into
``train.stable_phase.dir`` once it has its name), and a run with no checkpoint of its own starts from the one published
at its decay start, when there is one, training only its decay; without one it trains from step 0, the stable phase
included. Either way it ends as the run trained alone (tests/test_branches.py)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from hybrid_lightning.config import RunConfig
from hybrid_lightning.config.schedule import decay_start
from hybrid_lightning.fileio import fsync_dir
from hybrid_lightning.rundir import step_checkpoint_name
from hybrid_lightning.rundir.checkpoints import checkpoint_is_valid, read_checkpoint_meta
from hybrid_lightning.training.resume import Resume, check_extension, check_same_config

# What a branch's config may differ in from the run that published its start: the budget and the name.
BRANCH_KEYS = frozenset({"name", "train.max_steps", "train.tokens_per_param"})


def branch_point(cfg: RunConfig) -> Path | None:
    """The published checkpoint this run would start from: ``train.stable_phase.dir/step_<decay start>.ckpt``;
    None without ``train.stable_phase``."""
    phase = cfg.train.stable_phase
    return None if phase is None else Path(phase.dir) / step_checkpoint_name(decay_start(cfg.train))


def start_of_branch(cfg: RunConfig) -> Resume | None:
    """The stable phase's checkpoint at this run's decay start, checked to be of this run's model, data settings and
    seed (``BRANCH_KEYS`` and what may change on resume aside) and to have trained every step at this run's learning
    rate (``resume.check_extension``); None where none is published (a damaged one is passed over with a warning)."""
    path = branch_point(cfg)
    if path is None or not path.is_file():
        return None
    if not checkpoint_is_valid(path):
        warnings.warn(f"{path}: the stable phase's checkpoint is damaged; training the run from step 0", stacklevel=2)
        return None
    meta = read_checkpoint_meta(path)
    point = Resume(path, meta["step"], meta["config"], meta["data"])
    if point.config is not None:
        check_same_config(path.parent, point.config, cfg, path.name, also=BRANCH_KEYS,
                          hint="train.stable_phase.dir holds the stable phase of another run")
    check_extension(cfg, point)
    return point


def publish(path: Path, folder: Path) -> None:
    """Hard-links checkpoint ``path`` into ``folder`` under its name: the name appears whole or not at all, and a
    checkpoint published already stays (every run of the stable phase publishes the same state)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        os.link(path, folder / path.name)
    except FileExistsError:
        return
    fsync_dir(folder)
