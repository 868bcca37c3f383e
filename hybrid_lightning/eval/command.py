"""``hybrid-lightning eval RUN_DIR``: the callback's evaluation, offline, on a checkpoint of a run."""

from __future__ import annotations

from pathlib import Path

import torch

from hybrid_lightning.config import apply_overrides, config_to_dict, validate_config
from hybrid_lightning.rundir import find_resume_checkpoint, read_run_config


def evaluate_checkpoint(run_dir: str | Path, ckpt: str | Path | None = None, overrides: list[str] = ()) -> dict:
    """Evaluates a checkpoint of ``run_dir`` (default: its newest valid one) with the run's ``eval:``
    config, changed by ``eval.*`` overrides; writes ``eval/step_<k>.json`` and returns the report.

    On the machine that trained the run this gives the callback's numbers for the same weights:
    same probes, same batches, same precision.
    """
    from hybrid_lightning.data.datamodule import LMDataModule
    from hybrid_lightning.eval.callback import autocast_dtype
    from hybrid_lightning.eval.report import write_report
    from hybrid_lightning.eval.runner import LongContextEval, check_lengths
    from hybrid_lightning.model import build_model
    from hybrid_lightning.training.trainer import resolve_precision

    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    outside = [o for o in overrides if not o.startswith("eval.")]
    if outside:
        raise ValueError(f"eval overrides may only change eval.* keys, got {outside}")
    cfg = validate_config(apply_overrides(config_to_dict(cfg), list(overrides)))
    if ckpt is None:
        found = find_resume_checkpoint(run_dir)
        if found is None:
            raise ValueError(f"{run_dir}: no checkpoint to evaluate")
        ckpt = found[0]
    elif not Path(ckpt).is_file():
        raise ValueError(f"--ckpt: file not found: {ckpt}")
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.train.accelerator != "cpu" else "cpu")
    model = build_model(cfg.model)
    model.load_state_dict({k.removeprefix("model."): v for k, v in state["state_dict"].items()})
    model.to(device)
    data = LMDataModule(cfg)
    data.setup()
    check_lengths(cfg.eval, data.tokenizer)
    ev = LongContextEval(cfg.eval, data.tokenizer, data.val_tokens)
    step = int(state["global_step"])
    report = ev.run(model, step=step - 1, tokens=int(state["tokens_seen"]), dtype=autocast_dtype(resolve_precision(cfg)))
    write_report(run_dir, report)
    return report
