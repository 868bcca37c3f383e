"""The run-directory contract that training writes and the grid, callbacks and analysis read:

    <run_dir>/config.yaml          resolved config + provenance (git revision, package version, time, the
                                   fingerprint of the data)
    <run_dir>/plan.json            the run plan (runplan.py): every fact derived from the config, resolved once
    <run_dir>/status.json          {"state": running|done|failed|interrupted, "step", "max_steps", "host", "pid",
                                    "error"?, and in a scheduler's job its identity, e.g. "slurm_job_id"}
    <run_dir>/.lock                the one writer of the directory (host, pid, scheduler job) while it trains
                                   (fileio.RunLock)
    <run_dir>/checkpoints/last.ckpt and step_<N>.ckpt (periodic); a checkpoint's step is the one stored in it
    <run_dir>/events.out.tfevents.*  TensorBoard scalars and images (events.read_events)
    <run_dir>/eval/step_<k>.json   long-context evaluation records (EVAL_KINDS, evals.write_eval_record)
    <run_dir>/eval/heads_step_<k>.json  retrieval-head scores and ablations
    <run_dir>/eval/{restricted,layer_probe,gradient}_step_<k>.json  the paper's diagnostics (records.DIAGNOSTICS)
    <run_dir>/tracing/step_<k>.json  the final checkpoint's retrieval heads by attention mass traced at step k
                                   (heads/tracing.py), with their TensorBoard events
    <run_dir>/scalars.csv          a packed run's (analysis/pack.py) TensorBoard scalars, in place of the events

A grid keeps its own state in ``<root>/.grid/`` (GRID_DIR), beside its cells' run directories.

This module owns the names and paths; each job on the files has its module: ``files`` (config.yaml, plan.json),
``status`` (status.json and the process behind it), ``evals`` (evaluation records), ``events`` (TensorBoard),
``checkpoints`` (checkpoint checks) and ``legacy`` (every reading of a run an older version wrote).
"""

from __future__ import annotations

import re
from pathlib import Path

from hybrid_lightning.fileio import TMP_SUFFIX, stale_temporary

CONFIG_FILE = "config.yaml"
PLAN_FILE = "plan.json"
STATUS_FILE = "status.json"
CKPT_DIR = "checkpoints"
LAST_CKPT = "last.ckpt"
EVAL_DIR = "eval"
TRACING_DIR = "tracing"
SCALARS_FILE = "scalars.csv"  # a packed run's scalars: step, metric, value
GRID_DIR = ".grid"  # a grid's state (job records, lock, logs, cell configs) under its root; not a run
HPARAMS_SUFFIX = ".hparams"  # the TensorBoard event files of a run's HParams session, beside the training's
# Evaluation record kind -> file name prefix in EVAL_DIR: <prefix><step>.json.
EVAL_KINDS = {"longctx": "step_", "heads": "heads_step_", "restricted": "restricted_step_",
              "layer_probe": "layer_probe_step_", "gradient": "gradient_step_", "trace": "trace_step_"}
_EVAL_RE = re.compile(rf"^({'|'.join(map(re.escape, EVAL_KINDS.values()))})(\d+)\.json$")
DATA_KEY = "data"  # what training adds to config.yaml's provenance: the fingerprint of the data the run trains on
CKPT_SUFFIX = ".ckpt"
RANK_SIGNAL = ".rank-ended-by-signal."  # + pid: a rank other than 0 ended at once by a second signal (its number)


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


def eval_path(run_dir: Path, kind: str, step: int) -> Path:
    """The file of the ``kind`` (``EVAL_KINDS``) evaluation record at ``step``."""
    return Path(run_dir) / EVAL_DIR / f"{EVAL_KINDS[kind]}{step}.json"


def tracing_path(run_dir: Path, step: int) -> Path:
    """The tracing record of the checkpoint at ``step``."""
    return Path(run_dir) / TRACING_DIR / f"step_{step}.json"


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
