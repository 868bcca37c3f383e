"""The evaluation callbacks, the training-time driver of the long-context evaluation (``eval``) and of the
retrieval heads (``heads``). Every ``every_n_steps`` optimizer steps and when training ends, each evaluates
the model on all ranks and, on rank 0, logs to TensorBoard and writes a JSON record (the run plan checked their
probes before training):

- ``LongContextEvaluation`` (``eval:``): the long-context probes, per-position loss and LongPPL
  (runner.py; the probes' generation score every ``eval.generate_every_n_steps`` steps and at the
  end), the scalars and the depth x length heatmap, ``eval/step_<k>.json``;
- ``RetrievalHeadsEvaluation`` (``eval.heads:``): the retrieval score of every attention head
  (heads/retrieval.py), head counts and scores per layer, the layer x head image, ``eval/heads_step_<k>.json``;
- ``HeadTracing`` (``eval.trace:``): the paper's attention mass of every attention head, and the entropy and Q/K
  distance to the initialisation of the step's top heads (heads/tracing.py ``live_trace``),
  ``eval/trace_step_<k>.json``.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L

from hybrid_lightning.config import RunConfig
from hybrid_lightning.eval.longppl import evaluator_key_tokens
from hybrid_lightning.eval.report import heatmap, scalars, write_report
from hybrid_lightning.eval.runner import LongContextEval
from hybrid_lightning.eval.scoring import evaluating
from hybrid_lightning.heads.report import heads_scalars, score_image, scored_layers, write_heads
from hybrid_lightning.heads.retrieval import RetrievalHeads
from hybrid_lightning.heads.tracing import initialisation, live_trace, trace_samples, trace_scalars
from hybrid_lightning.plan.precision import autocast_dtype
from hybrid_lightning.records import HEADS_TAGS, LONGCTX_TAGS, TRACE_TAGS
from hybrid_lightning.rundir import eval_files
from hybrid_lightning.rundir.evals import read_eval_record, write_eval_record
from hybrid_lightning.training.steps import OnOptimizerSteps, say


class PeriodicEvaluation(OnOptimizerSteps, abc.ABC):
    """Runs ``evaluate`` every ``every`` optimizer steps (0 = never) and, with ``at_end``, when
    training ends at ``max_steps`` (not when a stop ends it earlier); on rank 0 writes its report and logs it
    under ``tag``, with ``<tag>/seconds``,
    and says on the console when an evaluation starts and how long it took.

    Records, their files and scalars carry the step evaluated: the optimizer steps completed
    (``trainer.global_step``), as the console, the checkpoints and every TensorBoard scalar do. The
    checkpoint of a step is saved before its evaluations, and a resumed run's logger hides only the
    steps after its resume step, so it keeps the evaluation of the step it resumes from.

    Args:
        every, at_end: the schedule.
        tag: TensorBoard prefix.
        on_time: called with the seconds each evaluation took (training throughput excludes them).
    """

    def __init__(self, every: int, at_end: bool, tag: str, on_time: Callable[[float], None] | None = None):
        self.every, self.at_end, self.tag, self.on_time = every, at_end, tag, on_time
        self._last_step: int | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step  # a resumed run has evaluated (or skipped) its resume step

    def on_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every and trainer.global_step % self.every == 0:
            self.run(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_end and trainer.global_step >= trainer.max_steps and self._last_step != trainer.global_step:
            self.run(trainer, pl_module)

    def run(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict | None:
        t0 = time.perf_counter()
        step = trainer.global_step
        if trainer.is_global_zero:
            say(f"step {trainer.global_step}: {self.tag} evaluation...")
        report = self.evaluate(trainer, pl_module, step)
        if report is None:
            return None
        self._last_step = trainer.global_step
        if trainer.is_global_zero:
            self.write_record(report)
            writer = trainer.logger.experiment if trainer.logger is not None else None
            if writer is not None:
                self.log_report(writer, report, step)
                writer.add_scalar(f"{self.tag}/seconds", time.perf_counter() - t0, step)
                writer.flush()
            say(f"step {trainer.global_step}: {self.tag} evaluation took {time.perf_counter() - t0:.1f} s")
        if self.on_time is not None:
            self.on_time(time.perf_counter() - t0)
        return report

    @abc.abstractmethod
    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict | None:
        """The report at ``step`` (every rank calls this), or None when there is nothing to evaluate."""

    @abc.abstractmethod
    def write_record(self, report: dict) -> None:
        """Writes ``report`` into the run directory (rank 0)."""

    @abc.abstractmethod
    def log_report(self, writer, report: dict, step: int) -> None:
        """Logs ``report`` to a TensorBoard ``SummaryWriter`` (rank 0)."""


class LongContextEvaluation(PeriodicEvaluation):
    """Args:
        cfg: the run config (its ``eval:`` section drives the callback).
        run_dir: where ``eval/step_<k>.json`` go.
        tokenizer: the run's tokenizer.
        on_time: called with the seconds each evaluation took.
    """

    def __init__(self, cfg: RunConfig, run_dir: Path, tokenizer, on_time: Callable[[float], None] | None = None):
        super().__init__(cfg.eval.every_n_steps, cfg.eval.at_end, LONGCTX_TAGS, on_time)
        self.cfg, self.run_dir, self.tokenizer = cfg, Path(run_dir), tokenizer
        self._eval: LongContextEval | None = None

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict | None:
        if self._eval is None:
            self._eval = LongContextEval(self.cfg.eval, self.tokenizer, trainer.datamodule.val_tokens,
                                         seq_len=self.cfg.train.seq_len, window=pl_module.plan.window)
        if not self._eval.specs and not self._eval.sequences:
            return None
        every = self.cfg.eval.generate_every_n_steps
        generate = (every and trainer.global_step % every == 0) or 0 < trainer.max_steps <= trainer.global_step
        if self._eval.sequences and self._eval.keys.key is None and self.cfg.eval.longppl_evaluator is not None:
            # until the evaluator has finished training, LongPPL is not reported (the reason is recorded)
            self._eval.keys = evaluator_key_tokens(self.cfg, self._eval.sequences, pl_module.device,
                                                   autocast_dtype(trainer.precision))
        return self._eval.run(pl_module.model, step=step, tokens=pl_module.tokens_at(trainer.global_step),
                              dtype=autocast_dtype(trainer.precision), rank=trainer.global_rank,
                              world=trainer.world_size, generate=bool(generate))

    def write_record(self, report: dict) -> None:
        write_report(self.run_dir, report)

    def log_report(self, writer, report: dict, step: int) -> None:
        for tag, value in scalars(report).items():
            writer.add_scalar(tag, value, step)
        if report["records"]:
            writer.add_figure(f"{self.tag}/heatmap", heatmap(report), step, close=False)


class RetrievalHeadsEvaluation(PeriodicEvaluation):
    """Retrieval scores of every attention head (``eval.heads:``), logged under ``val_longctx_heads/`` with the
    layer x head image ``val_longctx_heads/scores``, written to ``eval/heads_step_<k>.json``.

    Args:
        cfg: the run config (its ``eval.heads:`` section drives the callback).
        run_dir: where ``eval/heads_step_<k>.json`` go.
        tokenizer: the run's tokenizer.
        on_time: called with the seconds each evaluation took.
    """

    def __init__(self, cfg: RunConfig, run_dir: Path, tokenizer, on_time: Callable[[float], None] | None = None):
        super().__init__(cfg.eval.heads.every_n_steps, cfg.eval.heads.at_end, HEADS_TAGS, on_time)
        self.cfg, self.run_dir, self.tokenizer = cfg, Path(run_dir), tokenizer
        self._heads: RetrievalHeads | None = None
        self._scored: set[int] | None = None  # the layers whose heads have scored (heads_scalars)

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict:
        if self._heads is None:
            self._heads = RetrievalHeads(self.cfg.eval, self.tokenizer, trainer.datamodule.val_tokens)
        return self._heads.run(pl_module.model, step=step, tokens=pl_module.tokens_at(trainer.global_step),
                               dtype=autocast_dtype(trainer.precision), rank=trainer.global_rank,
                               world=trainer.world_size)

    def write_record(self, report: dict) -> None:
        write_heads(self.run_dir, report)

    def log_report(self, writer, report: dict, step: int) -> None:
        if self._scored is None:  # a resumed run: the layers its earlier records saw score
            earlier = (read_eval_record(path) for kind, k, path in eval_files(self.run_dir)
                       if kind == "heads" and k < step)
            self._scored = set().union(*(scored_layers(r) for r in earlier if r is not None))
        self._scored |= scored_layers(report)
        for tag, value in heads_scalars(report, self._scored).items():
            writer.add_scalar(tag, value, step)
        writer.add_figure(f"{self.tag}/scores", score_image(report), step, close=False)


class HeadTracing(PeriodicEvaluation):
    """The paper's tracing during training (``eval.trace:``): on rank 0, the attention mass of every attention head
    on the ``eval.trace`` probes and, for the step's top heads, their entropy and the distance of their Q/K rows to
    the initialisation (rebuilt from the run's seed, so also after a resume), logged under ``val_longctx_trace/``,
    written to ``eval/trace_step_<k>.json`` (``records.TRACING``).

    Args:
        cfg: the run config (its ``eval.trace:`` section drives the callback).
        plan: the run plan (the initialisation's model).
        run_dir: where ``eval/trace_step_<k>.json`` go.
        tokenizer: the run's tokenizer.
        on_time: called with the seconds each evaluation took.
    """

    def __init__(self, cfg: RunConfig, plan, run_dir: Path, tokenizer, on_time: Callable[[float], None] | None = None):
        super().__init__(cfg.eval.trace.every_n_steps, cfg.eval.trace.at_end, TRACE_TAGS, on_time)
        self.cfg, self.plan, self.run_dir, self.tokenizer = cfg, plan, Path(run_dir), tokenizer
        self._probes: tuple | None = None  # (samples, the model at initialisation)

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict | None:
        if not trainer.is_global_zero:  # the same model on every rank: one traces it
            return None
        model = pl_module.model
        if self._probes is None:
            initial = initialisation(self.plan, self.cfg.seed).to(next(model.parameters()).device)
            self._probes = trace_samples(self.cfg.eval, self.tokenizer, trainer.datamodule.val_tokens), initial
        with evaluating(model):
            return live_trace(model, self._probes[1], self._probes[0], self.cfg.eval.trace.top, step=step,
                              tokens=pl_module.tokens_at(trainer.global_step))

    def write_record(self, report: dict) -> None:
        write_eval_record(self.run_dir, "trace", report)

    def log_report(self, writer, report: dict, step: int) -> None:
        for tag, value in trace_scalars(report, self.tag).items():
            writer.add_scalar(tag, value, step)
