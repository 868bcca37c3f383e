"""The long-context evaluation callback: every ``eval.every_n_steps`` optimizer steps and when
training ends, evaluates the model (runner.py) on all ranks, and on rank 0 logs the scalars and
the depth x length heatmap to TensorBoard and writes ``eval/step_<k>.json``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch

from hybrid_lightning.config import RunConfig
from hybrid_lightning.eval.report import heatmap, scalars, write_report
from hybrid_lightning.eval.runner import LongContextEval, check_lengths

AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a Lightning precision string (None for true precisions)."""
    return AUTOCAST.get(str(precision))


class LongContextEvaluation(L.Callback):
    """Args:
        cfg: the run config (its ``eval:`` section drives the callback).
        run_dir: where ``eval/step_<k>.json`` go.
        tokenizer: the run's tokenizer.
        on_time: called with the seconds each evaluation took (training throughput excludes them).

    Records and scalars carry the step of the last training batch (``global_step - 1``), the
    step TensorBoard shows for that batch's loss, so that a resumed run, whose logger hides
    steps at or after its resume step, keeps the evaluation that preceded its checkpoint.
    """

    def __init__(self, cfg: RunConfig, run_dir: Path, tokenizer, on_time: Callable[[float], None] | None = None):
        check_lengths(cfg.eval, tokenizer)  # a bad eval.lengths fails before the run directory exists
        self.cfg, self.run_dir, self.tokenizer, self.on_time = cfg, Path(run_dir), tokenizer, on_time
        self._eval: LongContextEval | None = None
        self._last_step: int | None = None

    def _evaluator(self, trainer: L.Trainer) -> LongContextEval:
        if self._eval is None:
            self._eval = LongContextEval(self.cfg.eval, self.tokenizer, trainer.datamodule.val_tokens)
        return self._eval

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step  # a resumed run has evaluated (or skipped) its resume step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        every = self.cfg.eval.every_n_steps
        if every and trainer.global_step % every == 0 and self._last_step != trainer.global_step:
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.cfg.eval.at_end and not trainer.interrupted and self._last_step != trainer.global_step:
            self.evaluate(trainer, pl_module)

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict | None:
        t0 = time.perf_counter()
        step = trainer.global_step - 1
        ev = self._evaluator(trainer)
        if not ev.specs and not ev.sequences:
            return None
        report = ev.run(pl_module.model, step=step, tokens=pl_module.tokens_at(trainer.global_step),
                        dtype=autocast_dtype(trainer.precision), rank=trainer.global_rank, world=trainer.world_size)
        self._last_step = trainer.global_step
        if trainer.is_global_zero:
            write_report(self.run_dir, report)
            writer = trainer.logger.experiment if trainer.logger is not None else None
            if writer is not None:
                for tag, value in scalars(report).items():
                    writer.add_scalar(tag, value, step)
                if report["records"]:
                    writer.add_figure("longctx/heatmap", heatmap(report), step, close=False)
                writer.add_scalar("longctx/seconds", time.perf_counter() - t0, step)
                writer.flush()
        if self.on_time is not None:
            self.on_time(time.perf_counter() - t0)
        return report
