"""``hybrid-lightning heads RUN_DIR``: the retrieval-heads callback's scores of a run's checkpoint, and head
ablations (the checkpoint loaded as ``hybrid-lightning eval`` loads it, eval/offline.py)."""

from __future__ import annotations

import zlib
from pathlib import Path

from hybrid_lightning.config import RunConfig
from hybrid_lightning.eval.offline import load_checkpoint
from hybrid_lightning.heads.ablation import ablations, check_selection
from hybrid_lightning.heads.report import write_heads
from hybrid_lightning.heads.retrieval import RetrievalHeads
from hybrid_lightning.kinds import KINDS
from hybrid_lightning.runplan import RunPlan


def heads_checkpoint(run_dir: str | Path, ckpt: str | Path | None = None, overrides: list[str] = (),
                     selection: str | None = None, k: int | None = None, listed: list[tuple[int, int]] = (),
                     seed: int = 0, controls: int = 0, each: bool = False, mode: str = "zero") -> dict:
    """Retrieval scores of every attention head of a checkpoint (``load_checkpoint``) with the run's
    ``eval.heads:`` config and, with a ``selection`` or ``each``, head ablations on the run's ``eval:``
    probes (``ablation.ablations``, masking in ``mode``: heads chosen on held-out probes, ``controls`` random
    draws against the top K, every head alone). Writes ``eval/heads_step_<k>.json`` and returns the
    report, its ``ablation`` rows and ``ablation_tests`` included."""
    def check(cfg: RunConfig, plan: RunPlan) -> None:  # before the checkpoint and the data are read
        if selection is not None:
            heads = [(layer.index, h) for layer in plan.layers if KINDS[layer.mixer].attention
                     for h in range(cfg.model.n_heads)]
            check_selection(heads, selection, k, listed)

    run = load_checkpoint(run_dir, ckpt, overrides, check)
    tok, held_out = run.data.tokenizer, run.data.val_tokens
    report = RetrievalHeads(run.cfg.eval, tok, held_out).run(run.model, step=run.step, tokens=run.tokens,
                                                             dtype=run.dtype)
    if selection is not None or each:
        report |= ablations(run.model, run.cfg.eval, tok, held_out, report, selection=selection, k=k, listed=listed,
                            seed=seed, controls=controls, each=each, step=run.step, tokens=run.tokens, dtype=run.dtype,
                            mode=mode, run_key=zlib.crc32(Path(run_dir).resolve().name.encode()),
                            window=run.plan.window)
    write_heads(run_dir, report)
    return report
