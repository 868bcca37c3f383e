"""A run's checkpoints checked: whole or damaged, what each stores, and which one a run resumes from."""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path

from hybrid_lightning.rundir import CKPT_DIR, CKPT_SUFFIX, CONFIG_FILE, LAST_CKPT

DATA_FINGERPRINT = "data_fingerprint"  # a checkpoint's key: the fingerprint of the data it was trained on


def checkpoint_is_complete(path: Path) -> bool:
    """A torch zip checkpoint whose directory (written last) is readable: catches truncation cheaply."""
    try:
        with zipfile.ZipFile(path):
            return True
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


def checkpoint_is_valid(path: Path) -> bool:
    """A torch zip checkpoint whose every member passes its CRC (catches truncation and corruption)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


def read_checkpoint_meta(path: Path) -> dict:
    """``{"step", "config", "data", "plan"}`` of a checkpoint: its stored global step, the resolved run config
    it was trained with, the fingerprint of its data and its run plan (None where it has none). Tensors are
    memory-mapped, not read."""
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    stored = ckpt.get("hyper_parameters") or {}
    return {"step": int(ckpt["global_step"]), "config": stored.get("config"), "data": ckpt.get(DATA_FINGERPRINT),
            "plan": stored.get("plan")}


def not_run_or_checkpoint(path: Path) -> str | None:
    """Why ``path`` is neither a run directory (a folder with config.yaml) nor a checkpoint file in a run directory's
    checkpoints/ folder; None where it is one of them."""
    if not path.exists():
        return f"{path} does not exist"
    if path.is_file():
        if path.parent.name != CKPT_DIR or not (path.parent.parent / CONFIG_FILE).is_file():
            return f"{path} is not a checkpoint inside a run directory's {CKPT_DIR}/"
        return None
    return None if (path / CONFIG_FILE).is_file() else f"{path} is neither a run directory nor a checkpoint file"


def given_checkpoint(path: str | Path) -> Path:
    """A checkpoint file a user named (``--ckpt``), checked whole (every member's CRC); a ``ValueError`` naming it
    otherwise: missing, not a regular file, not a checkpoint (a YAML file, an empty or truncated file)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--ckpt: {'file not found' if not path.exists() else 'not a regular file'}: {path}")
    if not checkpoint_is_valid(path):
        raise ValueError(f"--ckpt: {path} is not a whole checkpoint (not a torch zip archive, empty, truncated or "
                         "damaged)")
    return path


def find_resume_checkpoint(run_dir: Path) -> tuple[Path, int] | None:
    """The newest valid checkpoint of the run as (path, global step), or None when the run has none
    (``newest_checkpoint``)."""
    found = newest_checkpoint(run_dir)
    return (found[0], found[1]["step"]) if found else None


def resume_step(run_dir: Path) -> int | None:
    """The step a rerun resumes from, read from the checkpoints on disk: the newest valid one's (0 without one;
    None where every checkpoint is damaged, which a rerun refuses, naming them)."""
    try:
        found = find_resume_checkpoint(run_dir)
    except ValueError:
        return None
    return found[1] if found else 0


def newest_checkpoint(run_dir: Path) -> tuple[Path, dict] | None:
    """The newest valid checkpoint of the run as (path, ``read_checkpoint_meta``), or None when the run has none.

    Every ``*.ckpt`` file of ``checkpoints/`` counts, whatever its name (``last.ckpt``, ``step_*``,
    a ``-vN`` copy of an older version): the newest is the one whose stored step is highest (on a tie
    ``last.ckpt`` first, as it holds the newest callback state). Each is checked (CRC of every member)
    from the newest down; a damaged one is skipped with a warning naming it. When checkpoints exist
    but none is valid, a ``ValueError`` names them rather than let a rerun silently start again.
    """
    folder = Path(run_dir) / CKPT_DIR
    if not folder.is_dir():
        return None
    files = [p for p in folder.iterdir() if p.suffix == CKPT_SUFFIX and not p.name.startswith(".") and p.is_file()]
    metas, damaged = [], []
    for path in files:
        try:
            metas.append((read_checkpoint_meta(path), path.name == LAST_CKPT, path))
        except Exception:  # any unreadable file: a damaged checkpoint, whatever torch raises
            damaged.append(path)
    for meta, _, path in sorted(metas, key=lambda t: (t[0]["step"], t[1]), reverse=True):
        if checkpoint_is_valid(path):
            for bad in damaged:
                warnings.warn(f"skipping damaged checkpoint {bad}", stacklevel=2)
            return path, meta
        damaged.append(path)
    if damaged:
        names = ", ".join(sorted(p.name for p in damaged))
        raise ValueError(f"{folder}: every checkpoint is damaged ({names}); move them out of the way to train "
                         "this run again from step 0")
    return None
