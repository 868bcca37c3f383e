"""Small training callbacks: throughput logging, a progress bar that knows max_steps, and a
stop at the next step boundary when asked (a requeue signal)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import _update_n


class Throughput(L.Callback):
    """Logs ``train/tokens_per_sec`` (all ranks) averaged over each logging interval."""

    def __init__(self, tokens_per_step: int, every: int):
        """tokens_per_step: tokens one rank consumes per optimizer step."""
        self.tokens_per_step, self.every = tokens_per_step, every
        self._t0: float | None = None
        self._steps = 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if self._t0 is None:
            self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        self._steps += 1
        if self._steps >= self.every:
            elapsed = time.perf_counter() - self._t0
            tokens = self._steps * self.tokens_per_step * trainer.world_size
            pl_module.log("train/tokens_per_sec", tokens / elapsed, prog_bar=True)
            self._t0, self._steps = time.perf_counter(), 0

    def exclude(self, seconds: float) -> None:
        """Leaves ``seconds`` spent outside training (an evaluation callback) out of the current interval."""
        if self._t0 is not None:
            self._t0 += seconds

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._t0 is not None:  # validation time is not training time
            self._t0 += time.perf_counter() - self._pause


class StepProgressBar(TQDMProgressBar):
    """One bar over optimizer steps, from the resumed step to max_steps."""

    def on_train_epoch_start(self, trainer: L.Trainer, *_) -> None:
        super().on_train_epoch_start(trainer)
        bar = self.train_progress_bar
        bar.total, bar.initial = trainer.max_steps, trainer.global_step
        _update_n(bar, trainer.global_step)
        bar.set_description("train")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        n = trainer.global_step
        if self._should_update(n, trainer.max_steps):
            _update_n(self.train_progress_bar, n)
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))


class StopOnRequest(L.Callback):
    """Stops training cleanly once ``request`` is set (e.g. by a SLURM timeout signal): at the end of
    the current optimizer step it writes ``checkpoint`` and ends ``fit``, so a resumed run loses no
    step and TensorBoard no series point.

    Args:
        request: set from a signal handler or another thread; read at every step end.
        checkpoint: where the stopping checkpoint goes (the run's ``last.ckpt``).
    """

    def __init__(self, request: threading.Event, checkpoint: Path):
        self.request, self.checkpoint = request, checkpoint

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        # Every rank must stop at the same step, so the decision is "any rank was asked".
        if trainer.strategy.reduce_boolean_decision(self.request.is_set(), all=False):
            trainer.save_checkpoint(self.checkpoint)
            trainer.should_stop = True
