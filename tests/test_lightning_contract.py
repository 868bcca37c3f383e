"""What the training code relies on in Lightning where Lightning has no public API for it: each test fails when
Lightning changes that behaviour (see the comment at each use)."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    """A linear regression that counts its validation batches."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.validated = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        self.validated += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)


class StopAt(L.Callback):
    """Stops fit after optimizer step ``step``, as ``checkpoints.StopOnRequest`` does, with or without turning
    validation off."""

    def __init__(self, step: int, no_validation: bool):
        self.step, self.no_validation = step, no_validation

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True
            if self.no_validation:
                trainer.limit_val_batches = 0


@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's advice on workers and small logging intervals
@pytest.mark.parametrize("no_validation", [False, True])
def test_a_zero_validation_limit_set_mid_fit_skips_the_validation_of_a_stop(tmp_path, no_validation):
    """Lightning validates when ``should_stop`` ends fit early (early stopping's contract), and has no public way
    to stop without it; ``StopOnRequest`` sets ``limit_val_batches = 0`` mid-fit to skip it. With the validation
    every 4 steps and a stop at step 3, the one validation that can run is the stop's."""
    module = Tiny()
    trainer = L.Trainer(
        default_root_dir=tmp_path, max_steps=10, val_check_interval=4, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, callbacks=[StopAt(3, no_validation)], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
    )
    trainer.fit(module)
    assert trainer.global_step == 3
    assert module.validated == (0 if no_validation else 2)  # the stop's validation: both batches, or none
