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

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if self._step_at_start is None or trainer.global_step != self._step_at_start:
            self.on_optimizer_step(trainer, pl_module)

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After optimizer step ``trainer.global_step`` (the steps completed so far) has ended."""


class AfterStepLogged(OnOptimizerSteps):
    """A callback that reports on an optimizer step once the step's values are in ``trainer.callback_metrics``:
    Lightning moves what a step logged there only after every callback's ``on_train_batch_end`` (so
    ``on_optimizer_step`` would read the step before's), and its validation's values after the validation.
    ``on_step_logged`` runs after the step's validation where it has one, else at the start of the next batch, or
    when training ends. A subclass that overrides ``on_train_batch_start``, ``on_validation_end`` or ``on_train_end``
    calls this class's."""

    _pending: int | None = None  # the step ended and not yet reported
    _validated: int | None = None  # the step the last validation ran at

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pending = trainer.global_step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._report(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.training or trainer.state.fn == "fit":
            self._validated = trainer.global_step
            self._report(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._report(trainer, pl_module)
        super().on_train_end(trainer, pl_module)

    def _report(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending is not None:
            step, self._pending = self._pending, None
            self.on_step_logged(trainer, pl_module, step, self._validated == step)

    def on_step_logged(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, validated: bool) -> None:
        """Optimizer step ``step`` has ended and its values are in ``trainer.callback_metrics``; ``validated``: the
        validation ran at it (its ``val/*`` are the step's own)."""
