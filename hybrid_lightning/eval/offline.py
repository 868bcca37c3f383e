"""The offline commands on a checkpoint of a run: ``hybrid-lightning eval RUN_DIR`` (the long-context
callback's evaluation) and ``hybrid-lightning heads RUN_DIR`` (the retrieval-heads callback's scores,
and head ablations)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from hybrid_lightning.config import RunConfig, apply_overrides, config_to_dict, validate_config
from hybrid_lightning.precision import autocast_dtype, resolve_precision
from hybrid_lightning.rundir import find_resume_checkpoint, read_run_config


@dataclass(frozen=True)
class Checkpoint:
    """A run's model at one checkpoint, ready to evaluate: ``step`` is the index of its last
    training batch (as the callbacks record it), ``dtype`` the autocast dtype of the run's precision."""

    cfg: RunConfig
    model: torch.nn.Module
    data: object  # the run's set-up LMDataModule (tokenizer, held-out tokens)
    step: int
    tokens: int
    dtype: torch.dtype | None


def load_checkpoint(run_dir: str | Path, ckpt: str | Path | None = None, overrides: list[str] = ()) -> Checkpoint:
    """Loads a checkpoint of ``run_dir`` (default: its newest valid one) with the run's config,
    changed by ``eval.*`` overrides. On the machine that trained the run, evaluating it gives the
    callbacks' numbers for the same weights: same probes, same batches, same precision."""
    from hybrid_lightning.data.datamodule import LMDataModule
    from hybrid_lightning.design import load_trained

    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    outside = [o for o in overrides if not o.startswith("eval.")]
    if outside:
        raise ValueError(f"overrides may only change eval.* keys, got {outside}")
    cfg = validate_config(apply_overrides(config_to_dict(cfg), list(overrides)))
    if ckpt is None:
        found = find_resume_checkpoint(run_dir)
        if found is None:
            raise ValueError(f"{run_dir}: no checkpoint to evaluate")
        ckpt = found[0]
    elif not Path(ckpt).is_file():
        raise ValueError(f"--ckpt: file not found: {ckpt}")
    model, state = load_trained(cfg.model, ckpt)
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.train.accelerator != "cpu" else "cpu")
    model.to(device)
    data = LMDataModule(cfg)
    data.setup()
    return Checkpoint(cfg, model, data, int(state["global_step"]) - 1, int(state["tokens_seen"]),
                      autocast_dtype(resolve_precision(cfg.train, cfg.model)))


def evaluate_checkpoint(run_dir: str | Path, ckpt: str | Path | None = None, overrides: list[str] = ()) -> dict:
    """Evaluates a checkpoint of ``run_dir`` (``load_checkpoint``) with the run's ``eval:`` config;
    writes ``eval/step_<k>.json`` and returns the report."""
    from hybrid_lightning.eval.longppl import evaluator_key_tokens
    from hybrid_lightning.eval.report import write_report
    from hybrid_lightning.eval.runner import LongContextEval, check_lengths

    run = load_checkpoint(run_dir, ckpt, overrides)
    check_lengths(run.cfg.eval, run.data.tokenizer)
    ev = LongContextEval(run.cfg.eval, run.data.tokenizer, run.data.val_tokens, seq_len=run.cfg.train.seq_len)
    if ev.sequences and run.cfg.eval.longppl_evaluator is not None:
        ev.keys = evaluator_key_tokens(run.cfg, ev.sequences, next(run.model.parameters()).device, run.dtype)
        if ev.keys.key is None:
            raise ValueError(ev.keys.reason)
    report = ev.run(run.model, step=run.step, tokens=run.tokens, dtype=run.dtype)
    write_report(run_dir, report)
    return report


def heads_checkpoint(run_dir: str | Path, ckpt: str | Path | None = None, overrides: list[str] = (),
                     selection: str | None = None, k: int | None = None, listed: list[tuple[int, int]] = (),
                     seed: int = 0, controls: int = 0, each: bool = False, mode: str = "zero") -> dict:
    """Retrieval scores of every attention head of a checkpoint (``load_checkpoint``) with the run's
    ``eval.heads:`` config and, with a ``selection`` or ``each``, head ablations on the run's ``eval:``
    probes (``ablation.ablations``, masking in ``mode``: heads chosen on held-out probes, ``controls`` random
    draws against the top K, every head alone). Writes ``eval/heads_step_<k>.json`` and returns the
    report, its ``ablation`` rows and ``ablation_tests`` included."""
    from hybrid_lightning.heads.ablation import ablations
    from hybrid_lightning.heads.retrieval import RetrievalHeads, check_heads_probes
    from hybrid_lightning.heads.report import write_heads

    run = load_checkpoint(run_dir, ckpt, overrides)
    tok, held_out = run.data.tokenizer, run.data.val_tokens
    check_heads_probes(run.cfg.eval, tok)
    report = RetrievalHeads(run.cfg.eval, tok, held_out).run(run.model, step=run.step, tokens=run.tokens, dtype=run.dtype)
    if selection is not None or each:
        report |= ablations(run.model, run.cfg.eval, tok, held_out, report, selection=selection, k=k, listed=listed, seed=seed,
                            controls=controls, each=each, step=run.step, tokens=run.tokens, dtype=run.dtype, mode=mode,
                            run_key=zlib.crc32(Path(run_dir).resolve().name.encode()))
    write_heads(run_dir, report)
    return report
