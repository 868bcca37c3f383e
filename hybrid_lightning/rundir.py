"""The run-directory contract that training writes and the grid, callbacks and analysis read:

    <run_dir>/config.yaml          resolved config + provenance (git revision, package version, time, the
                                   fingerprint of the data)
    <run_dir>/plan.json            the run plan (runplan.py): every fact derived from the config, resolved once
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

import dataclasses
import json
import logging
import os
import re
import socket
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hybrid_lightning.config import (
    PROVENANCE_KEY,
    RunConfig,
    config_to_dict,
    dump_config,
    flatten,
    read_text_file,
    read_yaml,
    validate_config,
)
from hybrid_lightning.fileio import TMP_SUFFIX, pid_alive, process_start, stale_temporary, write_atomic
from hybrid_lightning.kinds import expand, layer_traits
from hybrid_lightning.runplan import STEPS_INDEXED, Budget, LayerPlan, RunPlan, plan_from_dict

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
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
DATA_KEY = "data"  # what training adds to config.yaml's provenance: the fingerprint of the data the run trains on
# What runs written before plan.json recorded in config.yaml's provenance instead: the layers (one entry per
# layer: layer, kind, letter, window, pos) and the parameter counts; read_plan rebuilds their plans from them.
LAYERS_KEY, PARAMS_KEY = "layers", "params"
DATA_FINGERPRINT = "data_fingerprint"  # a checkpoint's key: the fingerprint of the data it was trained on
CKPT_SUFFIX = ".ckpt"


def step_checkpoint_name(step: int) -> str:
    """The file name of optimizer step ``step``'s periodic checkpoint in ``checkpoints/``: ``step_<N>.ckpt``."""
    return f"step_{step:07d}{CKPT_SUFFIX}"


def find_runs(root: str | Path) -> list[Path]:
    """Run directories under ``root`` (itself included): folders holding ``config.yaml``, sorted; ``.grid/`` skipped."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"DIR: {root} is not a folder")
    return sorted(p.parent for p in root.rglob(CONFIG_FILE) if GRID_DIR not in p.relative_to(root).parts)


def runs_under(root: str | Path) -> list[Path]:
    """``find_runs``, refusing a folder that holds none (``DIR``: the command line's argument)."""
    dirs = find_runs(root)
    if not dirs:
        raise ValueError(f"DIR: no run directory (a folder with {CONFIG_FILE}) under {root}")
    return dirs


def remove_temporaries(run_dir: Path) -> list[Path]:
    """Deletes the temporaries a killed writer left in the run directory (call it holding the lock): only files
    provably the package's (``fileio.stale_temporary``); a user's file there is left as it is."""
    run_dir = Path(run_dir)
    removed = []
    for folder in (run_dir, run_dir / CKPT_DIR, run_dir / EVAL_DIR):
        if folder.is_dir():
            for path in folder.glob(f".*{TMP_SUFFIX}"):
                if stale_temporary(path):
                    path.unlink(missing_ok=True)
                    removed.append(path)
    return removed


def read_config_dict(run_dir: Path) -> dict | None:
    """``config.yaml`` as plain data; None without one, a ``ValueError`` naming it when it does not read."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return None
    raw = read_yaml(read_text_file(path, "run config"), path) or {}
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


def write_plan(run_dir: Path, plan: RunPlan) -> None:
    write_atomic(Path(run_dir) / PLAN_FILE, json.dumps(plan.as_dict(), indent=1))


def read_plan(run_dir: Path) -> RunPlan:
    """The run's plan: ``plan.json``, or for a run written before plans were recorded, the plan rebuilt from its
    config.yaml (``RunPlan.rebuilt``). A ``ValueError`` names a file that does not read."""
    path = Path(run_dir) / PLAN_FILE
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"{path}: not JSON; the file is damaged") from None
        return plan_from_dict(data, str(path))
    raw = read_config_dict(run_dir)
    if raw is None:
        raise ValueError(f"{run_dir}: neither {PLAN_FILE} nor {CONFIG_FILE}; is this a run directory?")
    return _rebuilt_plan(run_dir, raw)


def _rebuilt_plan(run_dir: Path, raw: dict) -> RunPlan:
    """The plan of a run written before plan.json: its layers as its provenance recorded them (else from
    ``model.pattern``), its parameter counts, and its budget with the processes its evaluation records imply
    (tokens over steps; else ``train.devices``, ``auto`` counted as one, times ``train.num_nodes``). The config is
    read as written, a key it lacks taking today's default, not validated: a run of another version (a mixer this
    process does not know) is still read."""
    provenance = raw.pop(PROVENANCE_KEY, None) or {}
    written = flatten(raw)

    def value(key: str):
        return written.get(key, _DEFAULTS[key])

    if provenance.get(LAYERS_KEY):
        layers = [LayerPlan(r["layer"], r["kind"], r["window"], r["pos"]) for r in provenance[LAYERS_KEY]]
    else:
        try:
            mixers = expand(str(value("model.pattern")), int(value("model.n_layers")), value("model.mixer"))
            layers = [LayerPlan(i, m, *layer_traits(m, value("model.window"), value("model.pos.full"), value("model.pos.efficient")))
                      for i, m in enumerate(mixers)]
        except (KeyError, ValueError) as e:
            raise ValueError(f"{Path(run_dir) / CONFIG_FILE}: its layers cannot be read ({e}); the file is damaged "
                             "or of a version that recorded no layer plan") from None
    per_process = Budget(*(int(value(f"train.{k}")) for k in ("seq_len", "batch_size", "accumulate_grad_batches")), 1,
                         int(value("train.max_steps")))
    devices = value("train.devices")
    world = (1 if devices == "auto" else int(devices)) * int(value("train.num_nodes"))
    for _, _, path in eval_files(run_dir)[:1]:  # a record holds the tokens after step + 1 optimizer steps (STEPS_INDEXED)
        record = read_eval_record(path) or {}
        if record.get("tokens") and isinstance(record.get("step"), int):
            world = max(1, round(record["tokens"] / (record["step"] + 1) / per_process.tokens_per_step))
    budget = dataclasses.replace(per_process, world_size=world)
    return RunPlan(tuple(layers), budget, params=provenance.get(PARAMS_KEY), rebuilt=True, step_numbering=STEPS_INDEXED)


_DEFAULTS = flatten(config_to_dict(validate_config({})))  # every key's default, for configs written without it


def read_status(run_dir: Path) -> dict | None:
    """``status.json``, None without one. A file that does not read as a status (written whole or not at all, so
    damaged) reads ``{"state": "damaged", "error": ...}`` naming it; a ``running`` status whose process is gone
    (on this host) reads ``interrupted``: that process was killed without a chance to write."""
    path = Path(run_dir) / STATUS_FILE
    try:
        status = json.loads(path.read_text())
        if not isinstance(status, dict) or not isinstance(status.get("state"), str):
            raise ValueError("not a JSON object with a state")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return {"state": "damaged", "error": f"{path} does not read as a run status ({e}); training the run rewrites it"}
    pid, host = int(status.get("pid") or 0), status.get("host")
    if status.get("state") == "running" and host == socket.gethostname() and not pid_alive(pid, status.get("started")):
        status.update(state="interrupted", error=f"killed: its process (pid {pid} on {host}) ended without a word")
    return status


def process_status(state: str, step: int | None, max_steps: int, **extra) -> dict:
    """The fields of ``status.json`` for this process at ``step`` (None: every checkpoint damaged)."""
    return {"state": state, "step": step, "max_steps": max_steps, "host": socket.gethostname(), "pid": os.getpid(),
            "started": process_start(os.getpid()), "slurm_job_id": os.environ.get("SLURM_JOB_ID"), **extra}


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
    """An evaluation record, or None where it does not read (records are written whole or not at all, so damaged)."""
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


def given_checkpoint(path: str | Path) -> Path:
    """A checkpoint file a user named (``--ckpt``), checked whole (every member's CRC); a ``ValueError`` naming it
    otherwise: missing, not a regular file, not a checkpoint (a YAML file, an empty or truncated file)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--ckpt: {'file not found' if not path.exists() else 'not a regular file'}: {path}")
    if not checkpoint_is_valid(path):
        raise ValueError(f"--ckpt: {path} is not a whole checkpoint (not a torch zip archive, empty, truncated or damaged)")
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
