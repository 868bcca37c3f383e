"""Small training callbacks, each acting once per optimizer step (``steps.OnOptimizerSteps``): throughput
logging, status updates, a progress bar that knows max_steps, the console's start, progress and end lines,
peak memory, the last step logged and validated; and the run's summary at the start. The checkpoints and the
stops are checkpoints.py's, the evaluations evaluation.py's."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from tqdm import tqdm

from hybrid_lightning.config import RunConfig, dump_config
from hybrid_lightning.eval.report import headline, report_path
from hybrid_lightning.plan.precision import peak_bf16_tflops
from hybrid_lightning.records import Tag
from hybrid_lightning.rundir import CKPT_DIR, EVAL_DIR
from hybrid_lightning.rundir.status import process_status, write_status
from hybrid_lightning.runplan import RunPlan
from hybrid_lightning.training.hparams import study_hparams, write_session
from hybrid_lightning.training.layout import run_layout, viewer_hint
from hybrid_lightning.training.steps import AfterStepLogged, OnOptimizerSteps, say
from hybrid_lightning.units import si


class StatusUpdates(OnOptimizerSteps):
    """Writes the run's status (rank 0, ``running`` at the step reached) at every logging and checkpoint step,
    after the checkpoint writes queued before it (``AtomicCheckpointIO.later``)."""

    def __init__(self, run_dir: Path, every: tuple[int, ...]):
        self.run_dir, self.every = Path(run_dir), every

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if trainer.is_global_zero and any(step % n == 0 for n in self.every):
            fields = process_status("running", step, trainer.max_steps)
            trainer.strategy.checkpoint_io.later(lambda: write_status(self.run_dir, **fields))


class Throughput(OnOptimizerSteps):
    """Logs, averaged over each logging interval: ``train/tokens_per_sec`` (all ranks),
    ``train/tflops_per_sec`` (model FLOPs a device does per second: the plan's FLOPs per token times its
    tokens/s) and ``train/mfu`` (that over the device's dense bf16 peak, on a GPU of known peak training in
    bf16-mixed only)."""

    def __init__(self, plan: RunPlan, every: int):
        b = plan.budget
        self.tokens_per_step = b.tokens_per_step // b.world_size  # one rank's, every micro-batch of a step
        self.flops_per_token, self.every = plan.flops_per_token, every
        self._t0: float | None = None
        self._steps = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        device = pl_module.device
        gpu_bf16 = device.type == "cuda" and trainer.precision == "bf16-mixed"
        self.peak_tflops = peak_bf16_tflops(torch.cuda.get_device_name(device)) if gpu_bf16 else None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self._t0 is None:
            self._t0 = time.perf_counter()

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._steps += 1
        if self._steps >= self.every or trainer.global_step >= trainer.max_steps:  # the last step as well
            per_device = self._steps * self.tokens_per_step / (time.perf_counter() - self._t0)  # tokens/s
            tflops = per_device * self.flops_per_token / 1e12
            pl_module.log(Tag.TOKENS_PER_SEC, per_device * trainer.world_size, prog_bar=True)
            pl_module.log(Tag.TFLOPS, tflops)
            if self.peak_tflops:
                pl_module.log(Tag.MFU, tflops / self.peak_tflops)
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


class LastStep(OnOptimizerSteps):
    """Logs and validates the last step whatever ``log_every_n_steps`` and ``val_every_n_steps``: Lightning
    writes the step's scalars and runs validation when ``trainer.should_stop`` is set, so a 3-step run
    logs its scalars and a 40-step run its ``val/*`` at the end."""

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class PeakMemory(OnOptimizerSteps):
    """Logs ``train/peak_memory_gib`` every ``every`` steps and at the last: the peak of memory
    allocated by tensors on a GPU (``torch.cuda.max_memory_allocated``), else the process's peak
    resident memory (``getrusage``, all of it: weights, activations, data)."""

    def __init__(self, every: int):
        self.every = every

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step % self.every and trainer.global_step < trainer.max_steps:
            return
        if pl_module.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(pl_module.device)
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        pl_module.log(Tag.PEAK_MEMORY, peak / 2**30)


class Console(AfterStepLogged):
    """What a person reading the console or a cell's log sees (rank 0): a start line (run directory,
    parameters, tokens, the step training starts from); with ``every``, a progress line each ``every``
    steps (for runs without a progress bar); an end summary (final losses, the long-context score,
    where the outputs are). Each value printed is the step's own: a progress line is printed once the step's
    values are logged (``AfterStepLogged``), with ``val/*`` only at a step that validated; the last step
    validates (``LastStep``), so its line and the summary show the same values."""

    PROGRESS = (Tag.LOSS, Tag.VAL_LOSS, Tag.TOKENS_PER_SEC, Tag.LR)
    SUMMARY = (Tag.LOSS, Tag.VAL_LOSS, Tag.VAL_PPL, Tag.RETRIEVAL_ACC)

    def __init__(self, run_dir: Path, plan: RunPlan, every: int | None = None):
        self.run_dir, self.plan, self.every = Path(run_dir), plan, every

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            params, step = self.plan.params, trainer.global_step
            start = f"resuming at step {step}" if step else "from step 0"
            threads = torch.get_num_threads()  # training/threads.py chose them
            cpu = f", {threads} CPU thread{'s' if threads > 1 else ''}" if pl_module.device.type == "cpu" else ""
            say(f"{self.run_dir}: {params['total']:,} parameters ({params['non_embedding']:,} non-embedding), "
                f"{si(self.plan.budget.tokens)} tokens in {self.plan.budget.max_steps:,} steps, {start}{cpu}; "
                f"{self.plan.precision}, {self.plan.describe_kernels()}")

    def on_step_logged(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, validated: bool) -> None:
        if self.every and trainer.is_global_zero and (step % self.every == 0 or step >= trainer.max_steps):
            names = self.PROGRESS if validated else tuple(n for n in self.PROGRESS if n != Tag.VAL_LOSS)
            say(f"step {step}/{trainer.max_steps}  {_metrics(trainer, names)}")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)  # the last step's line first
        if not trainer.is_global_zero:
            return
        end = "done" if trainer.global_step >= trainer.max_steps else "stopped"
        record = report_path(self.run_dir, trainer.global_step)  # the evaluation at the end, if it ran
        score = headline(json.loads(record.read_text()))["score"] if record.is_file() else None
        scores = f"  val_longctx/score {score:.4g}" if score is not None else ""
        say(f"{self.run_dir}: {end} at step {trainer.global_step}: {_metrics(trainer, self.SUMMARY)}{scores}\n"
             f"  checkpoints in {self.run_dir / CKPT_DIR}, evaluations in {self.run_dir / EVAL_DIR}; "
             f"{viewer_hint(self.run_dir.parent, self.run_dir.name)}")


class RunSummary(L.Callback):
    """Writes, when training starts (rank 0), the resolved config and the fast paths of its plan (``RunPlan.kernels``)
    as TensorBoard text (``config``), the custom-scalars
    layout that leads with the headline (``layout.run_layout``) and the run's HParams session
    (``hparams.write_session``, unless a grid wrote its cell's), with the experiment summary."""

    def __init__(self, cfg: RunConfig, plan: RunPlan, run_dir: Path):
        self.cfg, self.plan, self.run_dir = cfg, plan, Path(run_dir)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.logger is None:
            return
        text = dump_config(self.cfg).rstrip("\n")
        text += f"\n\n# precision {self.plan.precision}, {self.plan.describe_kernels()}"
        # Markdown code
        trainer.logger.experiment.add_text("config", "    " + text.replace("\n", "\n    "), trainer.global_step)
        trainer.logger.experiment.add_custom_scalars(run_layout())
        values = study_hparams(self.cfg, self.plan)
        write_session(self.run_dir, values, {k: [v] for k, v in values.items()})


def _metrics(trainer: L.Trainer, names: tuple[str, ...]) -> str:
    """The latest value of each of ``names`` that was logged, as ``name value`` pairs."""
    found = trainer.callback_metrics
    return "  ".join(f"{name} {float(found[name]):.4g}" for name in names if name in found)


class StepProgressBar(AfterStepLogged, TQDMProgressBar):
    """One bar over optimizer steps, from the resumed step to max_steps, showing each step's values once they are
    logged (``AfterStepLogged``); its rate counts this process's steps only. No bar of Lightning's own: neither
    its epochs ("Epoch 0") nor its validation ("Validation DataLoader 0")."""

    @property
    def train_description(self) -> str:
        return "train"

    def init_validation_tqdm(self) -> tqdm:
        return tqdm(disable=True)  # validation is part of a step here, not a bar of its own

    def on_train_start(self, trainer: L.Trainer, *_) -> None:
        super().on_train_start(trainer)
        self._start(trainer)  # a resume in the middle of an epoch gets no on_train_epoch_start

    def on_train_epoch_start(self, trainer: L.Trainer, *_) -> None:
        self._start(trainer)  # not Lightning's: it names the bar after the epoch

    def _start(self, trainer: L.Trainer) -> None:
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps)
        bar.initial = trainer.global_step  # tqdm's rate is (n - initial) / elapsed
        _show(bar, trainer.global_step)
        bar.set_description("train")

    def on_step_logged(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, validated: bool) -> None:
        if self.is_enabled and (step % self.refresh_rate == 0 or step >= trainer.max_steps):
            _show(self.train_progress_bar, step)
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))


def _show(bar, n: int) -> None:
    """Sets a tqdm bar to ``n`` done and redraws it."""
    if not bar.disable:
        bar.n = n
        bar.refresh()


