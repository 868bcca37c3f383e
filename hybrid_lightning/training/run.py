"""One training run: validate, prepare the run directory, resume if possible, fit."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hybrid_lightning.config import RunConfig
from hybrid_lightning.data.integrity import fingerprint
from hybrid_lightning.data.run_store import ensure_store
from hybrid_lightning.fileio import IOFailure, RunLock
from hybrid_lightning.plan.resolve import provenance
from hybrid_lightning.rundir import DATA_KEY, remove_temporaries
from hybrid_lightning.rundir.checkpoints import resume_step
from hybrid_lightning.rundir.files import write_config, write_plan
from hybrid_lightning.rundir.status import process_status, read_status, write_status
from hybrid_lightning.runplan import RunPlan
from hybrid_lightning.training.branch import start_of_branch
from hybrid_lightning.training.preflight import is_rank_zero, preflight
from hybrid_lightning.training.resume import Resume, check_extension, check_numbering, check_same_run, recorded_data
from hybrid_lightning.training.stop import EndAtOnce, Stopped, clear_rank_signals, rank_signal

if TYPE_CHECKING:
    import lightning as L

    from hybrid_lightning.training.checkpoints import StopOnSignals


def train(cfg: RunConfig, run_dir: str | Path | None = None, callbacks: Sequence[L.Callback] = (),
          planned: Mapping | None = None, *, ends_process: bool = False) -> Path:
    """Trains (or resumes) the run in ``run_dir``; returns the run directory.

    Everything that can be wrong with the config is checked before the directory is created. Rank 0
    holds the directory's lock (``fileio.RunLock``) for the whole run; a directory in use by another
    command is refused. Training resumes from the newest valid checkpoint (``find_resume_checkpoint``).
    ``callbacks`` are added to the Trainer's own; one that stops training before ``train.max_steps``
    leaves the run ``interrupted``, to be resumed. SIGTERM and SIGINT, where no one else handles
    them, save a checkpoint at the end of the current step and raise ``Stopped`` (state ``interrupted``).
    ``planned``: the plan made where the run was submitted (a grid's cell, as plain data); a plan made here that
    differs is refused, naming the keys (``plan.resolve.check_planned``). ``ends_process``: the caller ends the
    process on ``Stopped`` (the command line), so the signal handlers stay for a second signal until it does.
    """
    cfg, plan, run_dir = preflight(cfg, run_dir, planned)  # every refusal a preview makes too (training/preflight.py)
    from hybrid_lightning.training.checkpoints import StopOnSignals

    signals = StopOnSignals(ends_process)
    signals.install()
    try:
        with RunLock(run_dir) if is_rank_zero() else contextlib.nullcontext() as lock:
            signals.at_once = EndAtOnce(run_dir, cfg.train.max_steps, lock)  # what a second signal does
            if is_rank_zero():
                remove_temporaries(run_dir)  # of a writer killed mid-write; the lock says none is running
                clear_rank_signals(run_dir)
            return _train_locked(cfg, plan, run_dir, [signals, *callbacks], signals)
    finally:
        signals.restore()


def _train_locked(cfg: RunConfig, plan: RunPlan, run_dir: Path, callbacks: list, signals: StopOnSignals) -> Path:
    from hybrid_lightning.training.callbacks import StatusUpdates

    resume = Resume.of(run_dir)  # the checkpoint read once, for every check below
    check_same_run(run_dir, cfg, resume)
    branch = resume is None and (resume := start_of_branch(cfg)) is not None  # a budget's branch of its stable phase
    step = resume.step if resume else 0
    check_extension(cfg, resume)
    if step >= cfg.train.max_steps:
        return _complete(cfg, run_dir, step)
    if not branch:  # a published checkpoint is of this version, which counts the steps completed
        check_numbering(run_dir, resume)
    # the token store: prepared (or awaited) before the run directory exists, and the data the run trained on
    store = ensure_store(cfg, recorded_data(run_dir, resume))
    # Imported here: Lightning is slow to import and not needed to validate.
    from hybrid_lightning.training.checkpoint_io import AtomicCheckpointIO
    from hybrid_lightning.training.trainer import build_trainer, fit

    status = StatusUpdates(run_dir, (cfg.train.log_every_n_steps, cfg.train.checkpoint_every_n_steps))
    trainer, module, datamodule = build_trainer(cfg, plan, run_dir, step, [*callbacks, status])
    io = trainer.strategy.checkpoint_io
    assert isinstance(io, AtomicCheckpointIO)
    signals.at_once.io = io
    if trainer.is_global_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_config(run_dir, cfg, {**provenance(), DATA_KEY: fingerprint(store.manifest)})
        write_plan(run_dir, plan)
    if resume is not None:
        print(f"{run_dir}: {f'branching from {resume.path}' if branch else f'resuming from {resume.path.name}'} "
              f"at step {step}")
    _status(trainer, run_dir, "running", step)
    try:
        fit(trainer, module, datamodule, resume.path if resume else None)  # saves the last step (StepCheckpoints)
        finished = trainer.global_step >= cfg.train.max_steps
        io.wait()  # every checkpoint on disk under its name, or the failure raised
    except BaseException as e:  # an error fails the run; a signal or an exit interrupts it
        io.teardown()
        ending = _ending(trainer, run_dir, e)
        if ending is e:
            raise
        raise ending from e
    io.teardown()
    if finished:
        _status(trainer, run_dir, "done", trainer.global_step)
        return run_dir
    saved = saved_step(trainer, run_dir)
    stopped = Stopped(signals.signum, saved) if signals.signum is not None else None  # on any rank (StopOnSignals)
    _status(trainer, run_dir, "interrupted", saved, **({"error": str(stopped)} if stopped else {}))
    if stopped:
        raise stopped
    return run_dir


def _ending(trainer, run_dir: Path, e: BaseException) -> BaseException:
    """Writes how ``e`` ended the run into its status (an error fails it; a signal or an exit interrupts it) and
    returns what to raise: ``e``, or ``Stopped`` where the collectives broke because another rank was ended at
    once by a second signal (``stop.rank_signal``), so that the run ends as that signal asked."""
    signum = rank_signal(run_dir) if isinstance(e, Exception) and trainer.world_size > 1 else None
    e = Stopped(signum) if signum is not None else e
    if isinstance(e, OSError) and e.errno:
        reason = str(IOFailure.of(e))
    else:
        reason = str(e) if isinstance(e, Stopped) else f"{type(e).__name__}: {e}"
    saved = saved_step(trainer, run_dir)  # where a rerun resumes, not the step training had reached
    with contextlib.suppress(OSError):  # a full disk may refuse this too; the error is raised anyway
        _status(trainer, run_dir, "failed" if isinstance(e, Exception) else "interrupted", saved, error=reason)
    if isinstance(e, Stopped):
        e.step = saved
    return e


def _complete(cfg: RunConfig, run_dir: Path, step: int) -> Path:
    """A run at its last step already: said, and its status made true (the process that trained it kept)."""
    print(f"{run_dir}: already complete ({step}/{cfg.train.max_steps} steps)")
    if is_rank_zero():
        old = {k: v for k, v in (read_status(run_dir) or {}).items() if k != "error"}
        write_status(run_dir, **{**old, "state": "done", "step": step, "max_steps": cfg.train.max_steps})
    return run_dir


def saved_step(trainer, run_dir: Path) -> int | None:
    """The step a rerun resumes from: the newest valid checkpoint's (0 without one; None where every checkpoint is
    damaged, which a rerun refuses, naming them). Rank 0 only (None on the others): it alone writes and rotates
    the checkpoints, and it writes the status."""
    return resume_step(run_dir) if trainer.is_global_zero else None


def _status(trainer, run_dir: Path, state: str, step: int | None, **extra) -> None:
    if trainer.is_global_zero:
        write_status(run_dir, **process_status(state, step, trainer.max_steps, **extra))


warnings.filterwarnings("ignore", message=".*srun.*command is available.*")
