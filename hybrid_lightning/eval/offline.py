"""A checkpoint of a run loaded to be evaluated offline (``load_checkpoint``), and ``hybrid-lightning eval
RUN_DIR``: the long-context callback's evaluation of it (``hybrid-lightning heads`` is heads/offline.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hybrid_lightning.config import RunConfig, apply_overrides, config_to_dict, validate_config
from hybrid_lightning.plan.precision import autocast_dtype
from hybrid_lightning.rundir.checkpoints import find_resume_checkpoint, given_checkpoint
from hybrid_lightning.runplan import RunPlan


@dataclass(frozen=True)
class Checkpoint:
    """A run's model at one checkpoint, ready to evaluate: ``step`` is its step as the run numbers its records
    (``RunPlan.step_numbering``: the optimizer steps completed, as the callbacks record it), ``dtype`` the autocast
    dtype of the run's precision."""

    cfg: RunConfig
    plan: RunPlan
    model: torch.nn.Module
    data: object  # the run's set-up LMDataModule (tokenizer, held-out tokens)
    step: int
    tokens: int
    dtype: torch.dtype | None


def load_checkpoint(run_dir: str | Path, ckpt: str | Path | None = None, overrides: list[str] = (),
                    check: Callable[[RunConfig, RunPlan], None] | None = None) -> Checkpoint:
    """Loads a checkpoint of ``run_dir`` (default: its newest valid one) with the run's config,
    changed by ``eval.*`` overrides. On the machine that trained the run, evaluating it gives the
    callbacks' numbers for the same weights: same probes, same batches, same precision. The overrides' probes
    (``probes.check.check_probes``), and ``check`` of the config and plan, are checked before the checkpoint and
    the data are read (nothing is prepared for a command refused)."""
    from hybrid_lightning.data.datamodule import LMDataModule
    from hybrid_lightning.data.tokenizer import load_tokenizer
    from hybrid_lightning.plan import load_trained
    from hybrid_lightning.plan.resolve import read_run
    from hybrid_lightning.probes.check import check_probes

    run_dir = Path(run_dir)
    cfg, plan = read_run(run_dir)
    outside = [o for o in overrides if not o.startswith("eval.")]
    if outside:
        raise ValueError(f"overrides may only change eval.* keys, got {outside}")
    cfg = validate_config(apply_overrides(config_to_dict(cfg), list(overrides)))
    check_probes(cfg.eval, load_tokenizer(cfg.data.tokenizer), cfg.train.seq_len)
    if check is not None:
        check(cfg, plan)
    if ckpt is None:
        found = find_resume_checkpoint(run_dir)
        if found is None:
            raise ValueError(f"{run_dir}: no checkpoint to evaluate")
        ckpt = found[0]
    else:
        ckpt = given_checkpoint(ckpt)
    model, state = load_trained(plan, ckpt)
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.train.accelerator != "cpu" else "cpu")
    model.to(device)
    data = LMDataModule(cfg)
    data.setup()
    step = int(state["global_step"]) - plan.step_offset
    return Checkpoint(cfg, plan, model, data, step, int(state["tokens_seen"]), autocast_dtype(plan.precision))


def evaluate_checkpoint(run_dir: str | Path, ckpt: str | Path | None = None, overrides: list[str] = ()) -> dict:
    """Evaluates a checkpoint of ``run_dir`` (``load_checkpoint``) with the run's ``eval:`` config;
    writes ``eval/step_<k>.json`` and returns the report."""
    from hybrid_lightning.eval.report import write_report

    run = load_checkpoint(run_dir, ckpt, overrides)
    report = long_context_eval(run).run(run.model, step=run.step, tokens=run.tokens, dtype=run.dtype)
    write_report(run_dir, report)
    return report


def long_context_eval(run: Checkpoint):
    """The long-context evaluation of the run's ``eval:`` config (``runner.LongContextEval``) with its LongPPL key
    tokens; a ``ValueError`` where its probes do not fit the tokenizer or its evaluator has no key tokens."""
    from hybrid_lightning.eval.longppl import evaluator_key_tokens
    from hybrid_lightning.eval.runner import LongContextEval

    ev = LongContextEval(run.cfg.eval, run.data.tokenizer, run.data.val_tokens, seq_len=run.cfg.train.seq_len,
                         window=run.plan.window)
    if ev.sequences and run.cfg.eval.longppl_evaluator is not None:
        ev.keys = evaluator_key_tokens(run.cfg, ev.sequences, next(run.model.parameters()).device, run.dtype)
        if ev.keys.key is None:
            raise ValueError(ev.keys.reason)
    return ev
