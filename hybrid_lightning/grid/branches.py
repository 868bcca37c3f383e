"""A grid's budgets as decay branches of one stable phase (``share_stable_phase: true`` in the grid file;
training/branch.py, docs/grids.md). The cells of one model, data and seed that differ only in their budget
(``train.max_steps`` or ``train.tokens_per_param``) share a folder under ``<root>/.grid/stable/``; each publishes
its checkpoint at the decay starts of the shorter ones, and each starts from the checkpoint published at its own
decay start where one is. Trained longest first, a group of budgets costs the longest run plus the other budgets'
decays: for 100, 200, 300, 400, 500 and 1,000 N with a 20% decay, 1,300 N of tokens instead of 2,500 N."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hybrid_lightning.config import config_to_dict, flatten
from hybrid_lightning.config.roles import may_change_on_resume
from hybrid_lightning.config.schedule import decay_start
from hybrid_lightning.config.stable import StablePhaseConfig
from hybrid_lightning.rundir import CKPT_DIR, CKPT_SUFFIX, GRID_DIR
from hybrid_lightning.training.branch import BRANCH_KEYS, branch_point

STABLE_DIR = "stable"  # under the grid's state folder: one folder per shared stable phase


def _group_key(cell) -> str:
    """What cells sharing a stable phase have in common: every key that is trained, except the budget and name."""
    values = flatten(config_to_dict(cell.config))
    return json.dumps({k: v for k, v in values.items() if k not in BRANCH_KEYS and not may_change_on_resume(k)},
                      sort_keys=True, default=str)


def share_stable_phases(cells: list, root: Path, name_of: Callable[[dict[str, Any]], str], where: str) -> list:
    """The planned ``cells`` with ``train.stable_phase`` set: their group's folder, named by the axis values the group
    shares (``name_of``), and the decay starts of the group's shorter budgets, which each publishes. A cell not under
    ``train.schedule: wsd`` is refused, naming it (``where``: the grid file)."""
    groups: dict[str, list] = {}
    for cell in cells:
        if cell.config.train.schedule != "wsd":
            raise ValueError(f"{where}: share_stable_phase needs train.schedule: wsd, but cell {cell.name} has "
                             f"{cell.config.train.schedule}: only WSD's stable phase does not depend on the budget")
        groups.setdefault(_group_key(cell), []).append(cell)
    out = {}
    for members in groups.values():
        shared = {k: v for k, v in members[0].labels.items() if all(c.labels[k] == v for c in members)}
        folder = root / GRID_DIR / STABLE_DIR / name_of(shared)
        starts = sorted({decay_start(c.config.train) for c in members})
        for cell in members:
            own = decay_start(cell.config.train)
            phase = StablePhaseConfig(dir=str(folder), publish=tuple(s for s in starts if s < own))
            train = cell.config.train.model_copy(update={"stable_phase": phase})
            out[cell.name] = dataclasses.replace(cell, config=cell.config.model_copy(update={"train": train}))
    return [out[c.name] for c in cells]


def branch_steps(cells: list) -> dict[str, int]:
    """Cell name -> the step it starts from once the longer budgets of its stable phase have run: its decay start
    where another cell of its stable phase publishes it, else 0."""
    published: dict[str, set[int]] = {}
    for cell in cells:
        phase = cell.config.train.stable_phase
        if phase is not None:
            published.setdefault(phase.dir, set()).update(phase.publish)
    out = {}
    for cell in cells:
        phase, start = cell.config.train.stable_phase, decay_start(cell.config.train)
        out[cell.name] = start if phase is not None and start in published[phase.dir] else 0
    return out


def launch_order(cells: list) -> list:
    """The cells the longest budget first among those sharing a stable phase, so that the shorter ones find their
    checkpoint published when they start (the others keep their order, after them)."""
    return sorted(cells, key=lambda c: -c.config.train.max_steps if c.config.train.stable_phase else 0)


def ready(cell, running: list) -> bool:
    """Whether ``cell`` should start now: not while one of the ``running`` cells of its stable phase has yet to
    publish the checkpoint it branches from (started now it would train from step 0, stable phase included),
    unless it resumes from a checkpoint of its own."""
    point, phase = branch_point(cell.config), cell.config.train.stable_phase
    if point is None or point.is_file() or any((cell.run_dir / CKPT_DIR).glob(f"*{CKPT_SUFFIX}")):
        return True
    start = decay_start(cell.config.train)
    return not any((other := c.config.train.stable_phase) is not None and other.dir == phase.dir
                   and start in other.publish for c in running)
