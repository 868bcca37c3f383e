"""Small training callbacks: the run's checkpoints, throughput logging, status updates, a progress bar
that knows max_steps, the console's start, progress and end lines, peak memory, the last step logged
and validated, and a stop at the next step boundary when asked (a signal)."""

from __future__ import annotations

import json
import resource
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import _update_n
from lightning.pytorch.trainer.states import TrainerStatus

from hybrid_lightning.config import RunConfig, config_to_dict, dump_config, flatten
from hybrid_lightning.eval.callback import say
from hybrid_lightning.eval.report import headline, report_path
from hybrid_lightning.model import count_params, model_flops_per_token
from hybrid_lightning.precision import peak_bf16_tflops
from hybrid_lightning.records import LONGCTX_TAGS
from hybrid_lightning.rundir import CKPT_DIR, EVAL_DIR, HPARAMS_SUFFIX
from hybrid_lightning.training.checkpoint_io import AtomicCheckpointIO
from hybrid_lightning.units import si
from hybrid_lightning.training.stop import Stopped


class StepCheckpoints(ModelCheckpoint):
    """``step_<N>.ckpt`` every ``every`` steps (the newest ``keep`` kept) and ``last.ckpt``: one name
    per step, overwritten rather than versioned (``-vN``), and paths that follow the run directory
    when it is moved.

    Lightning saves at the end of a step but logs that step's scalars afterwards, so a checkpoint
    of step N only gets its name (``AtomicCheckpointIO.commit``) at the start of step N + 1 or when
    training ends, once the TensorBoard events up to step N - 1 are flushed: a run that dies in
    between resumes from the previous checkpoint and TensorBoard misses no step. A background write
    failure is raised at the step after it.
    """

    def __init__(self, dirpath: Path, every: int, keep: int):
        super().__init__(
            dirpath=dirpath, filename="step_{step:07d}", auto_insert_metric_name=False, every_n_train_steps=every,
            save_last=True, save_top_k=keep, monitor="step", mode="max", save_on_train_epoch_end=False,
            enable_version_counter=False,
        )

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        _commit(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        _commit(trainer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        old = state_dict.get("dirpath")
        if old and self.dirpath and old != self.dirpath:  # the run directory moved: same files, new folder

            def moved(path: Any) -> Any:
                return self.dirpath + path[len(old):] if isinstance(path, str) and path.startswith(old) else path

            state_dict = {k: moved(v) for k, v in state_dict.items()}
            state_dict["best_k_models"] = {moved(k): v for k, v in state_dict.get("best_k_models", {}).items()}
        super().load_state_dict(state_dict)


def _commit(trainer: L.Trainer) -> None:
    io = trainer.strategy.checkpoint_io
    if isinstance(io, AtomicCheckpointIO):
        io.check()
        if io.pending and trainer.logger is not None:
            trainer.logger.experiment.flush()  # TensorBoard's writer otherwise holds events up to 2 min
        io.commit()


class SaveAtEnd(L.Callback):
    """Saves ``checkpoint`` and gives it its name when training reaches ``max_steps``, before the
    end-of-training evaluations (callbacks after this one), unless the periodic save (every
    ``every`` steps) just did: a stop during those evaluations keeps the last step."""

    def __init__(self, checkpoint: Path, every: int):
        self.checkpoint, self.every = checkpoint, every

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step >= trainer.max_steps and trainer.global_step % self.every:
            trainer.save_checkpoint(self.checkpoint, weights_only=False)
            _commit(trainer)


class OnOptimizerSteps(L.Callback):
    """A callback whose ``on_train_batch_end`` acts only on the micro-batch that ended an optimizer step
    (``stepped``): with gradient accumulation the other micro-batches end inside a step."""

    _step_at_start: int | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._step_at_start = trainer.global_step

    def stepped(self, trainer: L.Trainer) -> bool:
        return self._step_at_start is None or trainer.global_step != self._step_at_start


class StatusUpdates(OnOptimizerSteps):
    """Calls ``write(step)`` (rank 0) at every logging and checkpoint step, so that the run's status
    shows the step reached."""

    def __init__(self, write: Callable[[int], None], every: tuple[int, ...]):
        self.write, self.every = write, every

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if self.stepped(trainer) and trainer.is_global_zero and any(trainer.global_step % n == 0 for n in self.every):
            self.write(trainer.global_step)


class Throughput(OnOptimizerSteps):
    """Logs, averaged over each logging interval: ``train/tokens_per_sec`` (all ranks),
    ``train/tflops_per_sec`` (model FLOPs a device does per second: ``model_flops_per_token`` at the
    run's length times its tokens/s) and ``train/mfu`` (that over the device's dense bf16 peak, on a GPU
    of known peak training in bf16-mixed only)."""

    def __init__(self, tokens_per_step: int, every: int, seq_len: int):
        """tokens_per_step: tokens one rank consumes per optimizer step (every micro-batch of it)."""
        self.tokens_per_step, self.every, self.seq_len = tokens_per_step, every, seq_len
        self._t0: float | None = None
        self._steps = 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.flops_per_token = model_flops_per_token(pl_module.model, self.seq_len)
        device = pl_module.device
        gpu_bf16 = device.type == "cuda" and trainer.precision == "bf16-mixed"
        self.peak_tflops = peak_bf16_tflops(torch.cuda.get_device_name(device)) if gpu_bf16 else None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self._t0 is None:
            self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if not self.stepped(trainer):
            return
        self._steps += 1
        if self._steps >= self.every or trainer.global_step >= trainer.max_steps:  # the last step as well
            per_device = self._steps * self.tokens_per_step / (time.perf_counter() - self._t0)  # tokens/s
            tflops = per_device * self.flops_per_token / 1e12
            pl_module.log("train/tokens_per_sec", per_device * trainer.world_size, prog_bar=True)
            pl_module.log("train/tflops_per_sec", tflops)
            if self.peak_tflops:
                pl_module.log("train/mfu", tflops / self.peak_tflops)
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


class LastStep(L.Callback):
    """Logs and validates the last step whatever ``log_every_n_steps`` and ``val_every_n_steps``: Lightning
    writes the step's scalars and runs validation when ``trainer.should_stop`` is set, so a 3-step run
    logs its scalars and a 40-step run its ``val/*`` at the end."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class PeakMemory(L.Callback):
    """Logs ``train/peak_memory_gib`` every ``every`` steps and at the last: the peak of memory
    allocated by tensors on a GPU (``torch.cuda.max_memory_allocated``), else the process's peak
    resident memory (``getrusage``, all of it: weights, activations, data)."""

    def __init__(self, every: int):
        self.every = every

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step % self.every and trainer.global_step < trainer.max_steps:
            return
        if pl_module.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(pl_module.device)
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        pl_module.log("train/peak_memory_gib", peak / 2**30)


class Console(L.Callback):
    """What a person reading the console or a cell's log sees (rank 0): a start line (run directory,
    parameters, tokens, the step training starts from); with ``every``, a progress line each ``every``
    steps (for runs without a progress bar); an end summary (final losses, the long-context score,
    where the outputs are)."""

    PROGRESS = ("train/loss", "val/loss", "train/tokens_per_sec", "train/lr")
    SUMMARY = ("train/loss", "val/loss", "val/ppl", "val/retrieval_acc")

    def __init__(self, run_dir: Path, every: int | None = None):
        self.run_dir, self.every = Path(run_dir), every

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            counts, step = count_params(pl_module.model), trainer.global_step
            start = f"resuming at step {step}" if step else "from step 0"
            say(f"{self.run_dir}: {counts['total']:,} parameters ({counts['non_embedding']:,} non-embedding), "
                 f"{si(pl_module.tokens_at(trainer.max_steps))} tokens in {trainer.max_steps:,} steps, {start}")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if self.every and trainer.is_global_zero and (step % self.every == 0 or step >= trainer.max_steps):
            say(f"step {step}/{trainer.max_steps}  {_metrics(trainer, self.PROGRESS)}")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        end = "done" if trainer.global_step >= trainer.max_steps else "stopped"
        record = report_path(self.run_dir, trainer.global_step - 1)  # the evaluation at the end, if it ran
        score = headline(json.loads(record.read_text()))["score"] if record.is_file() else None
        scores = f"  val_longctx/score {score:.4g}" if score is not None else ""
        say(f"{self.run_dir}: {end} at step {trainer.global_step}: {_metrics(trainer, self.SUMMARY)}{scores}\n"
             f"  checkpoints in {self.run_dir / CKPT_DIR}, evaluations in {self.run_dir / EVAL_DIR}; "
             f"tensorboard --logdir {self.run_dir}")


# The config keys a study of hybrids varies: the HParams dashboard compares runs by them, on these metrics.
STUDY_KEYS = ("model.pattern", "model.mixer", "model.window", "model.pos.full", "model.pos.efficient", "seed")
HPARAMS_METRICS = ("train/loss", "val/loss", "val/text_loss", "val/synthetic_loss", "val/retrieval_acc", f"{LONGCTX_TAGS}/score",
                   f"{LONGCTX_TAGS}/score_beyond", f"{LONGCTX_TAGS}/longppl")


def study_hparams(cfg: RunConfig) -> dict[str, float | str]:
    """``STUDY_KEYS`` of ``cfg`` as HParams values (numbers as floats: one type per hparam across runs)."""
    flat = flatten(config_to_dict(cfg))
    return {k: float(flat[k]) if isinstance(flat[k], int) else flat[k] for k in STUDY_KEYS}


class RunSummary(L.Callback):
    """Writes, when training starts (rank 0), the resolved config as TensorBoard text (``config``) and,
    unless the run directory holds a session already (a grid writes its cells', grid/tensorboard.py),
    an HParams session of the run's ``STUDY_KEYS`` with an experiment naming them and ``HPARAMS_METRICS``
    (the same for every run, so that the one the dashboard picks among several fits them all)."""

    def __init__(self, cfg: RunConfig, run_dir: Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.logger is None:
            return
        from torch.utils.tensorboard.summary import hparams

        writer = trainer.logger.experiment
        text = dump_config(self.cfg).rstrip("\n")
        writer.add_text("config", "    " + text.replace("\n", "\n    "), trainer.global_step)  # a Markdown code block
        if not any(self.run_dir.glob(f"events.out.tfevents.*{HPARAMS_SUFFIX}")):
            experiment, session, _ = hparams(study_hparams(self.cfg), dict.fromkeys(HPARAMS_METRICS, 0.0))
            for summary in (experiment, session):
                writer._get_file_writer().add_summary(summary)


def _metrics(trainer: L.Trainer, names: tuple[str, ...]) -> str:
    """The latest value of each of ``names`` that was logged, as ``name value`` pairs."""
    found = trainer.callback_metrics
    return "  ".join(f"{name} {float(found[name]):.4g}" for name in names if name in found)


class StepProgressBar(TQDMProgressBar):
    """One bar over optimizer steps, from the resumed step to max_steps; its rate counts this
    process's steps only."""

    def on_train_start(self, trainer: L.Trainer, *_) -> None:
        super().on_train_start(trainer)
        self._start(trainer)  # a resume in the middle of an epoch gets no on_train_epoch_start

    def on_train_epoch_start(self, trainer: L.Trainer, *_) -> None:
        super().on_train_epoch_start(trainer)
        self._start(trainer)

    def _start(self, trainer: L.Trainer) -> None:
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps)
        bar.initial = trainer.global_step  # tqdm's rate is (n - initial) / elapsed
        _update_n(bar, trainer.global_step)
        bar.set_description("train")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        n = trainer.global_step
        if self._should_update(n, trainer.max_steps):
            _update_n(self.train_progress_bar, n)
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))


class StopOnRequest(OnOptimizerSteps):
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
        if not self.stepped(trainer):  # inside an accumulated step: a checkpoint falls on optimizer steps
            return
        # Every rank must stop at the same step, so the decision is "any rank was asked" (a collective,
        # skipped by a single process).
        asked = self.request.is_set()
        if trainer.world_size > 1:
            asked = self.any_rank(trainer, pl_module, asked)
        if asked:
            trainer.save_checkpoint(self.checkpoint, weights_only=False)
            trainer.should_stop = True
            if trainer.global_step < trainer.max_steps:  # not the end: no end-of-training evaluations
                trainer.state.status = TrainerStatus.INTERRUPTED
                # nor the validation Lightning runs on should_stop, before the checkpoint gets its name
                # (at the end of fit): under SLURM the SIGKILL comes KillWait after the SIGTERM
                trainer.limit_val_batches = 0

    def any_rank(self, trainer: L.Trainer, pl_module: L.LightningModule, asked: bool) -> bool:
        """Whether any rank was asked (a collective)."""
        return trainer.strategy.reduce_boolean_decision(asked, all=False)


class StopOnSignals(StopOnRequest):
    """SIGTERM and SIGINT where nobody else handles them (a local run; under submitit, SLURM's
    signals stay submitit's): the first one during training stops at the end of the current step
    with a checkpoint; one before training starts, or a second one, raises ``Stopped`` at once
    (a checkpoint being written is abandoned, the previous one stays). With several ranks, every
    rank learns the signal that one of them received (``signum``), so each exits by it.

    ``install`` before anything else, ``restore`` at the end; ``signum`` is the signal received.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, checkpoint: Path):
        super().__init__(threading.Event(), checkpoint)
        self.signum: int | None = None
        self._training = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.SIGNALS:
            if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
                self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def any_rank(self, trainer: L.Trainer, pl_module: L.LightningModule, asked: bool) -> bool:
        """Whether any rank received a signal; the one received (the largest number) becomes ``signum``."""
        received = trainer.strategy.reduce(torch.tensor(float(self.signum or 0), device=pl_module.device), reduce_op="max")
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
        raise Stopped(signum)
