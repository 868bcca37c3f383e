"""Assembles the Lightning ``Trainer`` for a run: logger, checkpoints, callbacks, cluster plugins."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment

from hybrid_lightning.config import RunConfig, config_to_dict
from hybrid_lightning.data.datamodule import LMDataModule
from hybrid_lightning.rundir import CKPT_DIR
from hybrid_lightning.runplan import RunPlan
from hybrid_lightning.training.callbacks import Console, LastStep, PeakMemory, RunSummary, StepProgressBar, Throughput
from hybrid_lightning.training.checkpoint_io import AtomicCheckpointIO
from hybrid_lightning.training.checkpoints import StepCheckpoints
from hybrid_lightning.training.cluster import set_main_address
from hybrid_lightning.training.evaluation import HeadTracing, LongContextEvaluation, RetrievalHeadsEvaluation
from hybrid_lightning.training.system import LMSystem
from hybrid_lightning.training.threads import set_threads

# The step sampler makes data order a function of the step, so Lightning's warning that a plain
# dataloader cannot resume mid-epoch does not apply; nor does its advice on dataloader workers.
# Lightning's own use of a deprecated torch API and its product tips are noise in a run's log.
# Lightning has no switch for these warnings or the banners below (only its loggers' levels, which would also
# hide its other notices), so they are matched by text; tests/test_run_console.py fails when a text changes.
for _pattern in (".*not resumable.*", ".*does not have many workers.*", ".*srun.*command is available.*",
                 ".*isn't resumable.*", ".*Checkpoint directory .* exists and is not empty.*",
                 r".*isinstance\(treespec, LeafSpec\).*is deprecated.*"):
    warnings.filterwarnings("ignore", message=_pattern)
# Lightning's banners ("GPU available: ...", "`Trainer.fit` stopped: ...", the CUDA devices, "Restoring states from the
# checkpoint ...") say nothing that a run's own start and end lines (callbacks.Console, "resuming from ...") don't.
_BANNERS = ("💡", "GPU available", "TPU available", "HPU available", "`Trainer.fit` stopped", "LOCAL_RANK: ",
            "Restoring states", "Restored all states")
for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda"):
    logging.getLogger(_name).addFilter(lambda record: not str(record.msg).startswith(_BANNERS))


class RunLogger(TensorBoardLogger):
    """Lightning's TensorBoard logger at the run's step numbering: a step is the optimizer steps completed
    (``runplan.STEPS_COMPLETED``), where Lightning writes a step's scalars, and the validation after it, at the
    0-based index of its last batch, one less. Without the ``epoch`` scalar it adds to every write: the step
    sampler makes a run one endless epoch, so it is always 0."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, None if step is None else step + 1)


def build_trainer(
    cfg: RunConfig, plan: RunPlan, run_dir: Path, resume_step: int = 0, extra_callbacks: Sequence[L.Callback] = ()
) -> tuple[L.Trainer, LMSystem, LMDataModule]:
    t = cfg.train
    set_threads(t)  # the cores this process was given, as a grid cell and the dry run take them
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    logger = RunLogger(
        save_dir=str(run_dir), name="", version="", default_hp_metric=False,
        # Steps after resume_step logged before a crash (or a restart from 0) are hidden by TensorBoard:
        # no duplicates, no gaps.
        purge_step=resume_step + 1,
    )
    phase = t.stable_phase
    checkpoints = StepCheckpoints(run_dir / CKPT_DIR, t.checkpoint_every_n_steps, t.keep_checkpoints,
                                  *((phase.publish, Path(phase.dir)) if phase else ()))
    throughput = Throughput(plan, t.log_every_n_steps)
    datamodule = LMDataModule(cfg)
    # the checkpoints first: the last step is saved before the evaluations at the end, so a stop during them keeps it
    callbacks = [checkpoints, throughput, PeakMemory(t.log_every_n_steps), LastStep(), RunSummary(cfg, plan, run_dir),
                 *extra_callbacks]
    if cfg.eval.every_n_steps or cfg.eval.at_end:
        callbacks.append(LongContextEvaluation(cfg, run_dir, datamodule.tokenizer, on_time=throughput.exclude))
    if cfg.eval.heads.every_n_steps or cfg.eval.heads.at_end:
        callbacks.append(RetrievalHeadsEvaluation(cfg, run_dir, datamodule.tokenizer, on_time=throughput.exclude))
    if cfg.eval.trace.every_n_steps or cfg.eval.trace.at_end:
        callbacks.append(HeadTracing(cfg, plan, run_dir, datamodule.tokenizer, on_time=throughput.exclude))
    if t.progress_bar:
        callbacks.append(StepProgressBar(refresh_rate=max(1, t.log_every_n_steps // 2)))
    # after the evaluations: it reports them
    callbacks.append(Console(run_dir, plan, None if t.progress_bar else t.log_every_n_steps))
    plugins = [AtomicCheckpointIO()]
    if SLURMEnvironment.detect():
        set_main_address()  # a first node whose name does not resolve: its NodeAddr
        plugins.append(SLURMEnvironment(auto_requeue=False))  # submitit owns requeue
    trainer = L.Trainer(
        default_root_dir=str(run_dir),
        max_steps=t.max_steps,
        max_epochs=-1,
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=t.strategy,
        precision=plan.precision,
        logger=logger,
        callbacks=callbacks,
        plugins=plugins,
        gradient_clip_val=t.grad_clip,
        accumulate_grad_batches=t.accumulate_grad_batches,
        log_every_n_steps=t.log_every_n_steps,  # counts optimizer steps
        val_check_interval=t.val_every_n_steps * t.accumulate_grad_batches,  # counts micro-batches
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        enable_progress_bar=t.progress_bar,
        enable_model_summary=False,
        enable_checkpointing=False,  # StepCheckpoints, not Lightning's ModelCheckpoint, writes the checkpoints
        use_distributed_sampler=False,  # the step sampler slices batches per rank itself
    )
    return trainer, LMSystem(config_to_dict(cfg), plan.as_dict()), datamodule


def fit(trainer: L.Trainer, module: LMSystem, datamodule: LMDataModule, ckpt_path: Path | None) -> None:
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt_path) if ckpt_path else None)
