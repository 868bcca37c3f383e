"""Small training callbacks: throughput logging and a progress bar that knows max_steps."""

from __future__ import annotations

import time

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
