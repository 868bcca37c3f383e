"""The run-directory contract that training writes and the grid, callbacks and analysis read:

    <run_dir>/config.yaml          resolved config + provenance (git revision, package version)
    <run_dir>/status.json          {"state": running|done|failed, "step", "max_steps", "error"?}
    <run_dir>/checkpoints/last.ckpt and step_<N>.ckpt (periodic)
    <run_dir>/events.out.tfevents.*  TensorBoard scalars and images (read_events)
    <run_dir>/eval/                evaluation records (JSON)
"""

from __future__ import annotations

import json
import logging
import os
import re
import warnings
import zipfile
from pathlib import Path

import yaml

from hybrid_lightning.config import PROVENANCE_KEY, RunConfig, validate_config

CONFIG_FILE = "config.yaml"
STATUS_FILE = "status.json"
CKPT_DIR = "checkpoints"
LAST_CKPT = "last.ckpt"
EVAL_DIR = "eval"
_STEP_RE = re.compile(r"step_(\d+)\.ckpt$")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_config_dict(run_dir: Path) -> dict | None:
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    return yaml.safe_load(path.read_text()) or {}


def read_run_config(run_dir: Path) -> RunConfig:
    """The run's config as written by ``train`` (provenance dropped)."""
    raw = read_config_dict(run_dir)
    if raw is None:
        raise ValueError(f"{run_dir}: no {CONFIG_FILE}; is this a run directory?")
    raw.pop(PROVENANCE_KEY, None)
    return validate_config(raw)


def read_status(run_dir: Path) -> dict | None:
    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_status(run_dir: Path, **fields) -> None:
    write_atomic(Path(run_dir) / STATUS_FILE, json.dumps(fields, indent=1))


def read_events(run_dir: Path, scalars: int = 0):
    """The run's TensorBoard events, loaded: an ``EventAccumulator`` keeping up to ``scalars`` values per
    scalar tag (0 = all; the newest is always kept) and one of every other kind, or None without event
    files. Steps that a resume purged are excluded."""
    if not any(Path(run_dir).glob("events.out.tfevents.*")):
        return None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": scalars, "tensors": 1, "images": 1, "histograms": 1,
                                                        "audio": 1, "compressedHistograms": 1})
    tb_log = logging.getLogger("tensorboard")
    level = tb_log.level
    tb_log.setLevel(logging.ERROR)  # a resumed run's purge is expected, not worth a warning here
    try:
        acc.Reload()
    finally:
        tb_log.setLevel(level)
    return acc


def checkpoint_is_valid(path: Path) -> bool:
    """A torch zip checkpoint whose every member passes its CRC (catches truncation and corruption)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


def checkpoint_step(path: Path) -> int:
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return int(ckpt["global_step"])


def find_resume_checkpoint(run_dir: Path) -> tuple[Path, int] | None:
    """The newest valid checkpoint of the run as (path, global step), or None for a fresh run.

    ``last.ckpt`` first, then periodic checkpoints from the newest; a damaged file is skipped
    with a warning naming it.
    """
    folder = Path(run_dir) / CKPT_DIR
    if not folder.is_dir():
        return None
    periodic = sorted(
        (p for p in folder.iterdir() if _STEP_RE.search(p.name)), key=lambda p: int(_STEP_RE.search(p.name)[1]), reverse=True
    )
    candidates = [folder / LAST_CKPT] if (folder / LAST_CKPT).exists() else []
    for path in candidates + periodic:  # last.ckpt is written with every periodic one: the newest
        if checkpoint_is_valid(path):
            return path, checkpoint_step(path)
        warnings.warn(f"skipping damaged checkpoint {path}", stacklevel=2)
    return None
