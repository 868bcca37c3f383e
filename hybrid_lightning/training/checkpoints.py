"""The run's checkpoints, written at optimizer-step boundaries only (``StepCheckpoints``), and the stops that end
training at one with a checkpoint (``StopOnRequest``, ``StopOnSignals``)."""

from __future__ import annotations

import re
import signal
import threading
from pathlib import Path
from typing import Any

import lightning as L
import torch

from hybrid_lightning.rundir import LAST_CKPT, step_checkpoint_name
from hybrid_lightning.training.checkpoint_io import AtomicCheckpointIO
from hybrid_lightning.training.steps import OnOptimizerSteps
from hybrid_lightning.training.stop import EndAtOnce, Stopped

STEP_FILE = re.compile(r"^step_(\d+)\.ckpt$")


class StepCheckpoints(OnOptimizerSteps):
    """``step_<N>.ckpt`` every ``every`` optimizer steps, at the last one and at each of ``publish`` (hard-linked into
    ``published`` too, ``train.stable_phase``), with ``last.ckpt`` beside it; of the
    step files the newest ``keep`` are kept (-1: all), whatever an earlier invocation kept (the files on disk
    decide, so ``train.keep_checkpoints`` may change on resume). A checkpoint is only ever written once an
    optimizer step has ended (never inside an accumulation window), at most once per file and step.

    A checkpoint of step N only gets its name (``AtomicCheckpointIO.commit``) at the start of step N + 1 or when
    training ends, once the TensorBoard events up to step N are flushed: a run that dies in between resumes from
    the previous checkpoint and TensorBoard misses no step. Old step files are removed by rank 0 (the strategy's
    ``remove_checkpoint``) after the newer one has its name. A background write failure is raised at the step
    after it.
    """

    def __init__(self, folder: Path, every: int, keep: int, publish: tuple[int, ...] = (),
                 published: Path | None = None):
        self.folder, self.every, self.keep = Path(folder), every, keep
        self.publish, self.published = publish, published  # train.stable_phase: steps saved and linked there
        self._saved: dict[str, int] = {}  # file name -> the step it was last written at

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.strategy.barrier("checkpoints")  # every rank has read its resume checkpoint before rank 0 rotates any

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        commit(trainer)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if step % self.every == 0 or step >= trainer.max_steps or step in self.publish:
            self.save(trainer, step_checkpoint_name(step))
            self.save(trainer, LAST_CKPT)
            if step in self.publish and trainer.is_global_zero:
                trainer.strategy.checkpoint_io.publish_checkpoint(self.folder / step_checkpoint_name(step),
                                                                  self.published)
            self._rotate(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        commit(trainer)

    def save(self, trainer: L.Trainer, name: str) -> None:
        """Writes ``name`` of the current step (every rank calls it; rank 0 writes), unless written at this step."""
        if self._saved.get(name) != trainer.global_step:
            trainer.save_checkpoint(self.folder / name, weights_only=False)
            self._saved[name] = trainer.global_step

    def _rotate(self, trainer: L.Trainer) -> None:
        if self.keep < 0:
            return
        steps = sorted((int(m[1]), p) for p in self.folder.glob("step_*.ckpt") if (m := STEP_FILE.match(p.name)))
        saved = {int(m[1]) for name in self._saved if (m := STEP_FILE.match(name))}
        kept = sorted({s for s, _ in steps} | saved)[-self.keep:] if self.keep else []
        for step, path in steps:
            if step not in kept:
                trainer.strategy.remove_checkpoint(path)  # queued after the newer file's rename


def commit(trainer: L.Trainer) -> None:
    """Gives the checkpoints saved so far their names, the TensorBoard events before them flushed first."""
    io = trainer.strategy.checkpoint_io
    if isinstance(io, AtomicCheckpointIO):
        io.check()
        if io.pending and trainer.logger is not None:
            trainer.logger.experiment.flush()  # TensorBoard's writer otherwise holds events up to 2 min
        io.commit()


class StopOnRequest(OnOptimizerSteps):
    """Stops training cleanly once ``request`` is set (e.g. by a SLURM timeout signal): at the end of the current
    optimizer step it writes the run's ``last.ckpt`` (``StepCheckpoints.save``) and ends ``fit``, so a resumed run
    loses no step and TensorBoard no series point.

    Args:
        request: set from a signal handler or another thread; read at every step end.
    """

    def __init__(self, request: threading.Event):
        self.request = request

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Every rank must stop at the same step, so the decision is "any rank was asked" (a collective,
        # skipped by a single process).
        asked = self.request.is_set()
        if trainer.world_size > 1:
            asked = self.any_rank(trainer, pl_module, asked)
        if asked:
            next(c for c in trainer.callbacks if isinstance(c, StepCheckpoints)).save(trainer, LAST_CKPT)
            trainer.should_stop = True
            if trainer.global_step < trainer.max_steps:  # not the end (the evaluations at the end ask the step)
                # No validation, which Lightning runs on should_stop, before the checkpoint gets its name (at the end
                # of fit): under SLURM the SIGKILL comes KillWait after the SIGTERM. Lightning has no public way to
                # stop fit without that validation; a zero limit turns ``trainer.enable_validation`` off for the rest
                # of fit (tests/test_lightning_contract.py fails when Lightning stops honouring it).
                trainer.limit_val_batches = 0

    def any_rank(self, trainer: L.Trainer, pl_module: L.LightningModule, asked: bool) -> bool:
        """Whether any rank was asked (a collective)."""
        return trainer.strategy.reduce_boolean_decision(asked, all=False)


class StopOnSignals(StopOnRequest):
    """SIGTERM and SIGINT where nobody else handles them (a local run; under submitit, SLURM's
    signals stay submitit's): the first one during training stops at the end of the current step
    with a checkpoint; one before training starts raises ``Stopped`` at once; a second one ends the
    process at once through ``at_once`` (``stop.EndAtOnce``: a checkpoint being written is abandoned,
    the previous one stays, the status names it), or raises ``Stopped`` where ``at_once`` is not set.
    With several ranks, every rank learns the signal that one of them received (``signum``), so each
    exits by it.

    ``install`` before anything else, ``restore`` at the end; ``signum`` is the signal received. With
    ``ends_process`` (the caller ends the process on ``Stopped``: the command line), a run stopped by a signal keeps
    the handlers through ``restore``, so a second signal, however late, still ends it at once with its exit code and
    message, not by the signal's default action.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, ends_process: bool = False) -> None:
        super().__init__(threading.Event())
        self.ends_process = ends_process
        self.signum: int | None = None
        self._training = False
        self._previous: dict[int, Any] = {}
        self.at_once: EndAtOnce | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.SIGNALS:
            if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
                self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        if self.ends_process and self.signum is not None and self.at_once is not None:
            return  # stopping: a second signal before the process exits still ends it at once
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def any_rank(self, trainer: L.Trainer, pl_module: L.LightningModule, asked: bool) -> bool:
        """Whether any rank received a signal; the one received (the largest number) becomes ``signum``."""
        received = trainer.strategy.reduce(torch.tensor(float(self.signum or 0), device=pl_module.device),
                                           reduce_op="max")
        if int(received) and self.signum is None:
            self.signum = int(received)
        return asked or bool(int(received))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._training = True
        for sig in self._previous:  # Lightning sets its own SIGTERM handler when fit starts
            signal.signal(sig, self._handle)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._training = False  # a signal now stops at once
        super().on_train_end(trainer, pl_module)

    def _handle(self, signum: int, frame) -> None:
        first = self.signum is None
        self.signum = self.signum or signum
        if first and self._training:
            print(f"{signal.Signals(signum).name}: stopping after this step with a checkpoint "
                  "(send it again to stop at once)", flush=True)
            self.request.set()
            return
        if not first and self.at_once is not None:
            self.at_once(signum)
        raise Stopped(signum)


class SigtermStaysWithTheJob(L.Callback):
    """Gives SIGTERM back to the job's handler when training starts. Lightning installs its own then,
    which broadcasts from inside the handler (a collective that hangs when the ranks are between
    other collectives: measured, a ``scancel`` of a two-node job waited for SIGKILL) and ends ``fit``
    at the next batch without a checkpoint. Lightning restores the job's handler at its teardown."""

    def __init__(self, handler):
        self.handler = handler

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        signal.signal(signal.SIGTERM, self.handler)
