"""The run-directory contract that training writes and the grid, callbacks and analysis read:

    <run_dir>/config.yaml          resolved config + provenance (git revision, package version, time,
                                   the layer plan and the parameter counts)
    <run_dir>/status.json          {"state": running|done|failed|interrupted, "step", "max_steps", "host", "pid",
                                    "slurm_job_id", "error"?}
    <run_dir>/.lock                the one writer of the directory (host, pid, SLURM job id) while it trains
                                   (fileio.RunLock)
    <run_dir>/checkpoints/last.ckpt and step_<N>.ckpt (periodic); a checkpoint's step is the one stored in it
    <run_dir>/events.out.tfevents.*  TensorBoard scalars and images (read_events)
    <run_dir>/eval/step_<k>.json   long-context evaluation records (EVAL_KINDS, write_eval_record)
    <run_dir>/eval/heads_step_<k>.json  retrieval-head scores and ablations
    <run_dir>/scalars.csv          a packed run's (analysis/pack.py) TensorBoard scalars, in place of the events

A grid keeps its own state in ``<root>/.grid/`` (GRID_DIR), beside its cells' run directories.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hybrid_lightning.config import PROVENANCE_KEY, RunConfig, dump_config, read_yaml, validate_config
from hybrid_lightning.fileio import TMP_SUFFIX, pid_alive, write_atomic

CONFIG_FILE = "config.yaml"
STATUS_FILE = "status.json"
CKPT_DIR = "checkpoints"
LAST_CKPT = "last.ckpt"
EVAL_DIR = "eval"
SCALARS_FILE = "scalars.csv"  # a packed run's scalars: step, metric, value
GRID_DIR = ".grid"  # a grid's state (job records, lock, logs, cell configs) under its root; not a run
HPARAMS_SUFFIX = ".hparams"  # the TensorBoard event files of a run's HParams session, beside the training's
# Evaluation record kind -> file name prefix in EVAL_DIR: <prefix><step>.json.
EVAL_KINDS = {"longctx": "step_", "heads": "heads_step_"}
_EVAL_RE = re.compile(rf"^({'|'.join(map(re.escape, EVAL_KINDS.values()))})(\d+)\.json$")
# What training adds to config.yaml's provenance besides git revision, version and time: the layer
# plan (one entry per layer with LAYER_FIELDS) and the parameter counts (PARAM_FIELDS).
LAYERS_KEY, LAYER_FIELDS = "layers", ("layer", "kind", "letter", "window", "pos")
PARAMS_KEY, PARAM_FIELDS = "params", ("embedding", "non_embedding", "total")
DATA_KEY = "data"  # and the fingerprint of the data the run trains on (config/resolve.py fingerprint)
DATA_FINGERPRINT = "data_fingerprint"  # a checkpoint's key: the fingerprint of the data it was trained on
CKPT_SUFFIX = ".ckpt"


def remove_temporaries(run_dir: Path) -> list[Path]:
    """Deletes the temporaries a killed writer left in the run directory (call it holding the lock)."""
    run_dir = Path(run_dir)
    removed = []
    for folder in (run_dir, run_dir / CKPT_DIR, run_dir / EVAL_DIR):
        if folder.is_dir():
            for path in folder.glob(f".*{TMP_SUFFIX}"):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def read_config_dict(run_dir: Path) -> dict | None:
    """``config.yaml`` as plain data; None without one, a ``ValueError`` naming it when it does not read."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    raw = read_yaml(path.read_text(), path) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a YAML mapping; the file is damaged")
    return raw


def write_config(run_dir: Path, cfg: RunConfig, provenance: Mapping) -> None:
    """Writes ``config.yaml``: the resolved config and its ``provenance`` section."""
    write_atomic(Path(run_dir) / CONFIG_FILE, dump_config(cfg, {PROVENANCE_KEY: dict(provenance)}))


def read_run_config(run_dir: Path) -> RunConfig:
    """The run's config as written by ``train`` (provenance dropped)."""
    raw = read_config_dict(run_dir)
    if raw is None:
        raise ValueError(f"{run_dir}: no {CONFIG_FILE}; is this a run directory?")
    raw.pop(PROVENANCE_KEY, None)
    return validate_config(raw)


def read_status(run_dir: Path) -> dict | None:
    """``status.json``, or None while it cannot be read. A ``running`` status whose process is gone
    (on this host) reads ``interrupted``: that process was killed without a chance to write."""
    path = Path(run_dir) / STATUS_FILE
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    pid, host = int(status.get("pid") or 0), status.get("host")
    if status.get("state") == "running" and host == socket.gethostname() and not pid_alive(pid):
        status.update(state="interrupted", error=f"killed: its process (pid {pid} on {host}) ended without a word")
    return status


def write_status(run_dir: Path, **fields) -> None:
    write_atomic(Path(run_dir) / STATUS_FILE, json.dumps(fields, indent=1))


def eval_path(run_dir: Path, kind: str, step: int) -> Path:
    """The file of the ``kind`` (``EVAL_KINDS``) evaluation record at ``step``."""
    return Path(run_dir) / EVAL_DIR / f"{EVAL_KINDS[kind]}{step}.json"


def eval_files(run_dir: Path) -> list[tuple[str, int, Path]]:
    """The run's evaluation records as (kind, step, path), sorted by file name; other files skipped."""
    folder = Path(run_dir) / EVAL_DIR
    kinds = {prefix: kind for kind, prefix in EVAL_KINDS.items()}
    found = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _EVAL_RE.match(path.name)
        if match is not None:
            found.append((kinds[match[1]], int(match[2]), path))
    return found


def read_eval_record(path: Path) -> dict | None:
    """An evaluation record, or None while it cannot be read (being written elsewhere: read it next time)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_eval_record(run_dir: Path, kind: str, record: dict, merge: Mapping[str, Sequence[str]] | None = None,
                      derived: Callable[[dict], dict] | None = None) -> Path:
    """Writes (or merges into) the ``kind`` record at ``record["step"]``; returns its path.

    Args:
        run_dir: the run directory.
        kind: a key of ``EVAL_KINDS``.
        record: the new record.
        merge: list field -> the row fields that identify a row: rows of the existing file whose key
            the new record's rows lack are kept, before the new rows. Other fields are replaced.
        derived: fields computed from the merged record (e.g. a score over all rows), set last.
    """
    path = eval_path(run_dir, kind, record["step"])
    path.parent.mkdir(parents=True, exist_ok=True)
    merged, merge = dict(record), merge or {}
    old = (read_eval_record(path) or {}) if merge else {}
    for name, keys in merge.items():
        def key(row: dict) -> tuple:
            return tuple(json.dumps(row.get(k)) for k in keys)  # JSON: fields may hold lists; a row may lack some

        new = record.get(name, [])
        replaced = {key(r) for r in new}
        merged[name] = [r for r in old.get(name, []) if key(r) not in replaced] + new
    if derived is not None:
        merged.update(derived(merged))
    write_atomic(path, json.dumps(merged, indent=1))
    return path


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
    """``{"step", "config", "data"}`` of a checkpoint: its stored global step, the resolved run config
    it was trained with and the fingerprint of its data (None where it has none). Tensors are
    memory-mapped, not read."""
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return {"step": int(ckpt["global_step"]), "config": (ckpt.get("hyper_parameters") or {}).get("config"),
            "data": ckpt.get(DATA_FINGERPRINT)}


def find_resume_checkpoint(run_dir: Path) -> tuple[Path, int] | None:
    """The newest valid checkpoint of the run as (path, global step), or None when the run has none.

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
    steps, damaged = [], []
    for path in files:
        try:
            steps.append((read_checkpoint_meta(path)["step"], path.name == LAST_CKPT, path))
        except Exception:  # any unreadable file: a damaged checkpoint, whatever torch raises
            damaged.append(path)
    for step, _, path in sorted(steps, key=lambda t: (t[0], t[1]), reverse=True):
        if checkpoint_is_valid(path):
            for bad in damaged:
                warnings.warn(f"skipping damaged checkpoint {bad}", stacklevel=2)
            return path, step
        damaged.append(path)
    if damaged:
        names = ", ".join(sorted(p.name for p in damaged))
        raise ValueError(f"{folder}: every checkpoint is damaged ({names}); move them out of the way to train "
                         "this run again from step 0")
    return None
