"""What every callback that acts once per optimizer step derives from, and the console's one way to print."""

from __future__ import annotations

import sys

import lightning as L
from tqdm import tqdm


def say(text: str) -> None:
    """Prints a line, above an active progress bar rather than into it."""
    tqdm.write(text)
    sys.stdout.flush()  # a cell's log shows the line now


class OnOptimizerSteps(L.Callback):
    """A callback that acts once per optimizer step: ``on_optimizer_step`` runs after the micro-batch that ended
    one (``trainer.global_step`` moved during it); with gradient accumulation the other micro-batches end inside
    a step and are passed over. A subclass that overrides ``on_train_batch_start`` or ``on_train_batch_end``
    calls this class's."""

    _step_at_start: int | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._step_at_start = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if self._step_at_start is None or trainer.global_step != self._step_at_start:
            self.on_optimizer_step(trainer, pl_module)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After optimizer step ``trainer.global_step`` (the steps completed so far) has ended."""
