"""The LightningModule: next-token loss, AdamW, warmup + cosine / WSD schedules, logging."""

from __future__ import annotations

import random

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric

from hybrid_lightning.config import RunConfig, validate_config
from hybrid_lightning.config.schedule import lr_factor
from hybrid_lightning.data.datamodule import VAL_HELD_OUT, VAL_TEXT, document_ids
from hybrid_lightning.data.tokenizer import load_tokenizer
from hybrid_lightning.plan.build import build_model
from hybrid_lightning.records import Tag
from hybrid_lightning.rundir.checkpoints import DATA_FINGERPRINT
from hybrid_lightning.rundir.legacy import plan_of_record


class NonFiniteLossError(FloatingPointError):
    """Raised when the loss or a gradient is NaN/inf; the message names the step and the tensor."""


class LMSystem(L.LightningModule):
    """Args: ``config``, the resolved run config, and ``plan``, its run plan, as plain data (both saved in every
    checkpoint)."""

    def __init__(self, config: dict, plan: dict):
        super().__init__()
        self.save_hyperparameters()
        self.cfg: RunConfig = validate_config(config)
        self.plan = plan_of_record(plan, "the run plan (hyper_parameters)")
        self.model = build_model(self.plan)
        self.model.activation_checkpointing = self.cfg.train.activation_checkpointing
        # data.doc_mask: documents end at this token; None = every sequence is one document
        self.eos_id = load_tokenizer(self.cfg.data.tokenizer).eos_id if self.cfg.data.doc_mask else None
        # Loss and argmax accuracy on the queried values of synthetic validation sequences,
        # pooled over tokens (weighted means; synced across ranks by torchmetrics).
        self.retrieval_loss = MeanMetric()
        self.retrieval_acc = MeanMetric()
        self._step_losses: list[torch.Tensor] = []  # of the micro-batches of the current optimizer step
        if self.cfg.train.compile:
            self.model.compile()  # in place: parameter names, and so checkpoints, stay those of the eager model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)

    def _logits(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, T, V) in fp32 for inputs batch[:, :-1] and the targets batch[:, 1:] (B, T)."""
        inputs = batch[:, :-1]
        doc_ids = None if self.eos_id is None else document_ids(inputs, self.eos_id)
        return self.model(inputs, doc_ids=doc_ids).float(), batch[:, 1:]

    def _loss(self, batch: torch.Tensor) -> torch.Tensor:
        logits, y = self._logits(batch)
        return F.cross_entropy(logits.transpose(1, 2), y)

    def setup(self, stage: str) -> None:
        if self.trainer.world_size != self.plan.budget.world_size:
            raise ValueError(f"train.devices x train.num_nodes: the run was planned for {self.plan.budget.world_size} "
                             f"processes but trains in {self.trainer.world_size}; set train.devices to a number")

    def on_train_start(self) -> None:
        """Every rank starts at one step, and that step's learning rate is this run's schedule's, whatever the
        checkpoint it resumes from holds: one saved under another ``train.max_steps`` (a budget's branch from its
        stable phase, a run extended) holds the rate its own schedule gave the step."""
        step = self.global_step
        if self.trainer.world_size > 1:
            steps = self.all_gather(torch.tensor(step, device=self.device))  # (world,)
            if steps.min() != steps.max():
                raise RuntimeError(f"the ranks resumed at different steps ({steps.tolist()}): a checkpoint appeared "
                                   "while they started; run again")
        scheduler = self.lr_schedulers()
        rates = [base * lr_factor(step, self.cfg.train) for base in scheduler.base_lrs]  # as LambdaLR computes them
        for group, rate in zip(self.optimizers().param_groups, rates, strict=True):
            group["lr"] = rate
        scheduler._last_lr = rates  # what LambdaLR's step sets beside the groups' rates (its state_dict holds it)

    def tokens_at(self, step: int) -> int:
        """Training tokens consumed by all ranks after ``step`` optimizer steps (the plan's)."""
        return self.plan.budget.tokens_at(step)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"non-finite training loss ({loss.item()}) at step {self.global_step}")
        self._step_losses.append(loss.detach())
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Once per optimizer step, after the backward of its last micro-batch: logs the step's loss (the mean
        over its micro-batches, equal in tokens) and checks the gradients."""
        self.log(Tag.LOSS, torch.stack(self._step_losses).mean(), prog_bar=True)  # every step: the progress bar
        self._step_losses.clear()
        # The logger writes step metrics every log_every_n_steps steps only, and each self.log call costs
        # about 4 ms of CPU (measured: Lightning moves its metric state on every call), so lr and tokens
        # are logged on the steps that are written.
        if self._written_step():
            self.log(Tag.LR, self.optimizers().param_groups[0]["lr"])
            self.log(Tag.TOKENS, float(self.tokens_at(self.global_step + 1)))
        named = [(name, p.grad) for name, p in self.named_parameters() if p.grad is not None]
        norms = torch.stack(torch._foreach_norm([g for _, g in named]))  # one device sync per step
        if not torch.isfinite(norms).all():
            name = next(name for (name, _), norm in zip(named, norms) if not torch.isfinite(norm))
            raise NonFiniteLossError(f"non-finite gradient of {name} at step {self.global_step}")
        if self._written_step():  # before clipping: the norm train.grad_clip is compared with
            self.log(Tag.GRAD_NORM, norms.norm())

    def _written_step(self) -> bool:
        """Whether the logger writes this step's scalars: every log_every_n_steps and the last (callbacks.LastStep)."""
        step = self.global_step + 1
        return step % self.trainer.log_every_n_steps == 0 or step >= self.trainer.max_steps

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        held = self.trainer.datamodule.val_sets()[dataloader_idx]  # the data module owns the loaders' order
        if held == VAL_HELD_OUT:
            loss = self._loss(batch)
            self.log(Tag.VAL_LOSS, loss, add_dataloader_idx=False, sync_dist=True)
            self.log(Tag.VAL_PPL, loss.exp(), add_dataloader_idx=False, sync_dist=True)
            return
        if held == VAL_TEXT:
            self.log(Tag.TEXT_LOSS, self._loss(batch), add_dataloader_idx=False, sync_dist=True)
            return
        tokens, targets = batch
        logits, y = self._logits(tokens)
        losses = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")  # (B, T)
        target = targets[:, 1:]  # (B, T): predicting a queried value needs retrieval
        n = target.sum()
        self.retrieval_loss.update((losses * target).sum() / n.clamp(min=1), weight=n)
        self.retrieval_acc.update(((logits.argmax(-1) == y) & target).sum() / n.clamp(min=1), weight=n)
        log = {"add_dataloader_idx": False, "sync_dist": True}
        self.log(Tag.SYNTHETIC_LOSS, losses.mean(), **log)
        self.log(Tag.RETRIEVAL_LOSS, self.retrieval_loss, add_dataloader_idx=False)
        self.log(Tag.RETRIEVAL_ACC, self.retrieval_acc, add_dataloader_idx=False)

    def configure_optimizers(self):
        cfg = self.cfg.train
        # Weight decay on matrices only; norms, biases and 1-d mixer parameters are not decayed.
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, cfg))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tokens_seen"] = self.tokens_at(self.global_step)  # for evaluations of the checkpoint
        # resumed on this data only
        checkpoint[DATA_FINGERPRINT] = getattr(self.trainer.datamodule, "fingerprint", None)
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        checkpoint["rng"] = {  # plain types and tensors only, so weights-only loading accepts them
            "torch": torch.get_rng_state(),
            "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        rng = checkpoint.get("rng")
        if rng:
            torch.set_rng_state(rng["torch"])
            kind, keys, pos, has_gauss, gauss = rng["numpy"]
            np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
            random.setstate(rng["python"])
            if rng["cuda"] is not None and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
