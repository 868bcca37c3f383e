"""One training run: validate, prepare the run directory, resume if possible, fit."""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import socket
import subprocess
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hybrid_lightning import __version__
from hybrid_lightning.config import PROVENANCE_KEY, RunConfig, config_to_dict, flatten, validate_config
from hybrid_lightning.data.corpus import check_sources
from hybrid_lightning.data.integrity import fingerprint
from hybrid_lightning.data.store import ensure_store
from hybrid_lightning.data.tokenizer import load_tokenizer
from hybrid_lightning.eval.heads import check_probes
from hybrid_lightning.model import HybridLM, count_params
from hybrid_lightning.model.matching import non_embedding_params
from hybrid_lightning.rundir import (
    CKPT_DIR,
    CONFIG_FILE,
    LAST_CKPT,
    LAYER_FIELDS,
    LAYERS_KEY,
    PARAM_FIELDS,
    PARAMS_KEY,
    IOFailure,
    RunLock,
    find_resume_checkpoint,
    read_checkpoint_meta,
    read_config_dict,
    read_status,
    remove_temporaries,
    write_config,
    write_status,
)
from hybrid_lightning.training.stop import Stopped

if TYPE_CHECKING:
    import lightning as L

    from hybrid_lightning.training.callbacks import StopOnSignals

# Keys that may change when a run directory is trained again (they do not change the result;
# train.max_steps only where the steps trained keep their learning rates: check_extension).
RESUMABLE_CHANGES = {
    "train.max_steps", "train.progress_bar", "train.checkpoint_every_n_steps", "train.keep_checkpoints",
    "train.log_every_n_steps", "train.compile", "data.num_workers", "data.cache_dir",
    "data.store", "data.shard_mb", "data.prepare_workers",
}
RESUMABLE_SECTIONS = ("eval.",)
DATA_KEY = "data"  # config.yaml's provenance: the fingerprint of the data the run trains on


def resolve_config(cfg: RunConfig) -> RunConfig:
    """Fills what follows from other settings: the vocabulary size from the tokenizer, the name, and
    ``train.max_steps`` from ``train.tokens_per_param``."""
    check_sources(cfg.data)
    model = cfg.model
    if model.vocab_size is None:
        model = model.model_copy(update={"vocab_size": load_tokenizer(cfg.data.tokenizer).vocab_size})
    cfg = cfg.model_copy(update={"model": model, "name": cfg.name or "run"})
    if cfg.train.tokens_per_param is None:
        return cfg
    steps = budget_steps(cfg)
    if cfg.train.warmup_steps >= steps > 1:
        raise ValueError(f"train.warmup_steps={cfg.train.warmup_steps} must be below train.max_steps={steps} "
                         f"(from train.tokens_per_param={cfg.train.tokens_per_param})")
    raw = config_to_dict(cfg)
    raw["train"]["max_steps"] = steps
    return validate_config(raw)


def budget_steps(cfg: RunConfig) -> int:
    """Optimizer steps for ``train.tokens_per_param`` x the non-embedding parameters, rounded up."""
    t = cfg.train
    tokens_per_step = t.batch_size * t.seq_len * t.devices * t.num_nodes
    return max(1, math.ceil(t.tokens_per_param * non_embedding_params(cfg.model) / tokens_per_step))


def default_run_dir(cfg: RunConfig) -> Path:
    return Path("runs") / (cfg.name or "run")


def git_revision() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if rev.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(model: HybridLM) -> dict:
    """The ``provenance`` section of config.yaml: git revision, package version, time, and what analysis
    reads without building the model: the layer plan and the parameter counts (rundir.LAYERS_KEY, PARAMS_KEY)."""
    counts = count_params(model)
    return {
        "git_revision": git_revision(),
        "package_version": __version__,
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        LAYERS_KEY: [{k: layer[k] for k in LAYER_FIELDS} for layer in counts["layers"]],
        PARAMS_KEY: {k: counts[k] for k in PARAM_FIELDS},
    }


def check_same_run(run_dir: Path, cfg: RunConfig, checkpoint: Path | None = None) -> None:
    """A run directory belongs to one config; only harmless keys may change between invocations.

    The config is compared with ``config.yaml`` and with the config stored in ``checkpoint`` (the
    one training would resume from), so that a lost or edited ``config.yaml`` cannot resume a
    checkpoint under another model.
    """
    old = read_config_dict(run_dir)
    if old is not None:
        old.pop(PROVENANCE_KEY, None)
        _check_same(run_dir, old, cfg, CONFIG_FILE)
    stored = read_checkpoint_meta(checkpoint)["config"] if checkpoint is not None else None
    if stored is not None:
        _check_same(run_dir, stored, cfg, f"{CKPT_DIR}/{checkpoint.name}")


def check_extension(cfg: RunConfig, checkpoint: Path | None, step: int) -> None:
    """A changed ``train.max_steps`` is taken only where every step already trained keeps its learning
    rate under the new schedule (constant; WSD before its decay began; cosine within its warmup), so
    that the run ends as one trained with the new ``train.max_steps`` from the start; else a ``ValueError``."""
    old = read_checkpoint_meta(checkpoint)["config"] if checkpoint is not None else None
    if old is None or old["train"]["max_steps"] == cfg.train.max_steps:
        return
    from hybrid_lightning.training.system import lr_factor  # imports Lightning: only for a changed max_steps

    before, after = validate_config(old).train, cfg.train
    changed = next((s for s in range(step) if lr_factor(s, before) != lr_factor(s, after)), None)
    if changed is not None:
        raise ValueError(
            f"train.max_steps: {before.max_steps} -> {after.max_steps} would change the learning rate of step {changed}, "
            f"already trained, under train.schedule={after.schedule} (it depends on train.max_steps"
            f"{' once its decay began' if after.schedule == 'wsd' else ''}): the run would not equal one trained for "
            f"{after.max_steps} steps; train that as a new run (another --run-dir), or plan runs to extend with "
            "train.schedule=constant or wsd")


def _check_same(run_dir: Path, old: dict, cfg: RunConfig, source: str) -> None:
    a, b = flatten(old), flatten(config_to_dict(cfg))
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    blocking = [k for k in changed if k not in RESUMABLE_CHANGES and not k.startswith(RESUMABLE_SECTIONS)]
    if blocking:
        diffs = "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in blocking[:8])
        raise ValueError(f"{run_dir} holds a run with another config (by its {source}: {diffs}); use another --run-dir")


def recorded_data(run_dir: Path, checkpoint: Path | None) -> dict | None:
    """The data fingerprint (``data.integrity.fingerprint``) a run recorded: the checkpoint's it resumes
    from, else config.yaml's; None for a new run."""
    stored = read_checkpoint_meta(checkpoint).get("data") if checkpoint is not None else None
    return stored or ((read_config_dict(run_dir) or {}).get(PROVENANCE_KEY) or {}).get(DATA_KEY)


def check_devices(cfg: RunConfig) -> None:
    """Refuses, before anything is prepared, devices that this machine cannot give."""
    import torch

    t = cfg.train
    if t.accelerator == "gpu" and not torch.cuda.is_available():
        raise ValueError("train.accelerator=gpu, but torch sees no GPU on this machine; use train.accelerator=auto or cpu")
    if t.accelerator == "gpu" and t.devices != "auto" and t.devices > torch.cuda.device_count():
        raise ValueError(f"train.devices={t.devices}, but this machine has {torch.cuda.device_count()} GPUs")


def is_rank_zero() -> bool:
    """Whether this process is global rank 0, from the environment (before any Trainer exists):
    Lightning's launcher, torchrun and SLURM set these for every other rank."""
    return all(os.environ.get(k, "0") == "0" for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK"))


def train(cfg: RunConfig, run_dir: str | Path | None = None, callbacks: Sequence[L.Callback] = ()) -> Path:
    """Trains (or resumes) the run in ``run_dir``; returns the run directory.

    Everything that can be wrong with the config is checked before the directory is created. Rank 0
    holds the directory's lock (``rundir.RunLock``) for the whole run; a directory in use by another
    command is refused. Training resumes from the newest valid checkpoint (``find_resume_checkpoint``).
    ``callbacks`` are added to the Trainer's own; one that stops training before ``train.max_steps``
    leaves the run ``interrupted``, to be resumed. SIGTERM and SIGINT, where no one else handles
    them, save a checkpoint at the end of the current step and raise ``Stopped`` (state ``interrupted``).
    """
    cfg = resolve_config(cfg)
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"--run-dir {run_dir} is a file, not a folder; give a run directory")
    check_devices(cfg)
    from hybrid_lightning.training.callbacks import StopOnSignals

    signals = StopOnSignals(run_dir / CKPT_DIR / LAST_CKPT)
    signals.install()
    try:
        with RunLock(run_dir) if is_rank_zero() else contextlib.nullcontext():
            if is_rank_zero():
                remove_temporaries(run_dir)  # of a writer killed mid-write; the lock says none is running
            return _train_locked(cfg, run_dir, [signals, *callbacks], signals)
    finally:
        signals.restore()


def _train_locked(cfg: RunConfig, run_dir: Path, callbacks: list, signals: StopOnSignals) -> Path:
    from hybrid_lightning.training.callbacks import StatusUpdates

    resume = find_resume_checkpoint(run_dir)
    check_same_run(run_dir, cfg, resume[0] if resume else None)
    step = resume[1] if resume else 0
    check_extension(cfg, resume[0] if resume else None, step)
    if step >= cfg.train.max_steps:
        print(f"{run_dir}: already complete ({step}/{cfg.train.max_steps} steps)")
        if is_rank_zero():  # the process that trained it stays recorded
            old = {k: v for k, v in (read_status(run_dir) or {}).items() if k != "error"}
            write_status(run_dir, **{**old, "state": "done", "step": step, "max_steps": cfg.train.max_steps})
        return run_dir
    check_probes(cfg.eval, load_tokenizer(cfg.data.tokenizer))  # before any store or directory exists
    # the token store: prepared (or awaited) before the run directory exists, and the data the run trained on
    store = ensure_store(cfg, recorded_data(run_dir, resume[0] if resume else None))
    # Imported here: Lightning is slow to import and not needed to validate.
    from hybrid_lightning.training.checkpoint_io import AtomicCheckpointIO
    from hybrid_lightning.training.trainer import build_trainer, fit

    status = StatusUpdates(lambda n: None, (cfg.train.log_every_n_steps, cfg.train.checkpoint_every_n_steps))
    trainer, module, datamodule = build_trainer(cfg, run_dir, step, [*callbacks, status])
    io = trainer.strategy.checkpoint_io
    assert isinstance(io, AtomicCheckpointIO)
    status.write = lambda n: io.later(lambda: _status(trainer, run_dir, "running", n, cfg))
    if trainer.is_global_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_config(run_dir, cfg, {**provenance(module.model), DATA_KEY: fingerprint(store.manifest)})
    if resume is not None:
        print(f"{run_dir}: resuming from {resume[0].name} at step {step}")
    _status(trainer, run_dir, "running", step, cfg)
    try:
        fit(trainer, module, datamodule, resume[0] if resume else None)  # saves the last step (SaveAtEnd)
        finished = trainer.global_step >= cfg.train.max_steps
        io.wait()  # every checkpoint on disk under its name, or the failure raised
    except BaseException as e:  # an error fails the run; a signal or an exit interrupts it
        io.teardown()
        state = "failed" if isinstance(e, Exception) else "interrupted"
        if isinstance(e, OSError) and e.errno:
            reason = str(IOFailure.of(e))
        else:
            reason = str(e) if isinstance(e, Stopped) else f"{type(e).__name__}: {e}"
        saved = saved_step(run_dir)  # where a rerun resumes, not the step training had reached
        with contextlib.suppress(OSError):  # a full disk may refuse this too; the error is raised anyway
            _status(trainer, run_dir, state, saved, cfg, error=reason)
        if isinstance(e, Stopped):
            e.step = saved
        raise
    io.teardown()
    if finished:
        _status(trainer, run_dir, "done", trainer.global_step, cfg)
        return run_dir
    saved = saved_step(run_dir)
    stopped = Stopped(signals.signum, saved) if signals.signum is not None else None  # on any rank (StopOnSignals)
    _status(trainer, run_dir, "interrupted", saved, cfg, **({"error": str(stopped)} if stopped else {}))
    if stopped:
        raise stopped
    return run_dir


def saved_step(run_dir: Path) -> int:
    """The step a rerun resumes from: the newest valid checkpoint's (0 without one)."""
    try:
        found = find_resume_checkpoint(run_dir)
    except ValueError:  # every checkpoint damaged
        return 0
    return found[1] if found else 0


def _status(trainer, run_dir: Path, state: str, step: int, cfg: RunConfig, **extra) -> None:
    if trainer.is_global_zero:
        write_status(
            run_dir, state=state, step=step, max_steps=cfg.train.max_steps, host=socket.gethostname(), pid=os.getpid(),
            slurm_job_id=os.environ.get("SLURM_JOB_ID"), **extra,
        )


warnings.filterwarnings("ignore", message=".*srun.*command is available.*")
