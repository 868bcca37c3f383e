"""(f) Peak memory of a training step with and without activation checkpointing, measured, beside the
estimate ``grid plan`` and ``train`` use (``hybrid_lightning.plan.memory``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybrid_lightning.bench.measure import peak_memory
from hybrid_lightning.config import RunConfig, validate_config
from hybrid_lightning.plan import build_model
from hybrid_lightning.plan.resolve import make_plan

MODELS = {  # four kinds of hybrid at the sizes of the CPU replica
    "SWA-64 EEEF, d=128": {"n_layers": 4, "d_model": 128, "n_heads": 4, "pattern": "EEEF", "mixer": "swa",
                           "window": 64},
    "Gated DeltaNet EF, d=64": {"n_layers": 4, "d_model": 64, "n_heads": 2, "pattern": "EF", "mixer": "gated_deltanet"},
    "Mamba-2 EF, d=64": {"n_layers": 2, "d_model": 64, "n_heads": 2, "pattern": "EF", "mixer": "mamba2",
                         "mamba2": {"head_dim": 32, "d_state": 16}},
    "Lightning EEEF, d=128": {"n_layers": 4, "d_model": 128, "n_heads": 4, "pattern": "EEEF", "mixer": "lightning"},
}


def config(model: dict, batch_size: int, seq_len: int) -> RunConfig:
    return validate_config({"model": {**model, "vocab_size": 257},
                            "train": {"batch_size": batch_size, "seq_len": seq_len, "precision": "32"}})


def measured_peak(cfg: RunConfig, checkpointing: bool) -> int:
    """Peak bytes of one fp32 AdamW training step on CPU: the weights and optimizer state held (a first step
    made them) plus what the second step allocates at most (the profiler's allocation events, ``peak_memory``)."""
    torch.manual_seed(0)
    model = build_model(cfg.model)
    model.activation_checkpointing = checkpointing
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.train.seq_len + 1))

    def step() -> None:
        logits = model(tokens[:, :-1]).float()
        F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:]).backward()
        opt.step()
        opt.zero_grad()

    step()
    held = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # weights, exp_avg, exp_avg_sq
    return held + peak_memory(step, torch.device("cpu"))


def run(quick: bool) -> dict:
    batch, seq_len = (2, 128) if quick else (8, 512)
    rows = []
    for name, model in (list(MODELS.items())[:1] if quick else MODELS.items()):
        cfg = config(model, batch, seq_len)
        estimate = make_plan(cfg).memory_estimate
        for on in (False, True):
            peak = measured_peak(cfg, on)
            rows.append({"model": name, "checkpointing": "on" if on else "off", "measured MiB": peak / 2**20,
                         "estimated MiB": estimate.peak(on) / 2**20, "estimate / measured": estimate.peak(on) / peak})
        rows[-1]["off / on"] = rows[-2]["measured MiB"] / rows[-1]["measured MiB"]
    return {
        "title": "(f) Peak memory of a training step, activation checkpointing off and on",
        "columns": ["model", "checkpointing", "measured MiB", "estimated MiB", "estimate / measured", "off / on"],
        "rows": rows,
        "notes": (f"Batch {batch} x {seq_len}, fp32, AdamW, one CPU step after a first one. Measured: the weights and "
                  "AdamW's moments held, plus the most the step allocates on top, from the allocation events of "
                  "PyTorch's profiler (profile_memory=True; tensors only, not the process's RSS). Estimated: "
                  "hybrid_lightning.plan.memory, from fake tensors (no allocation)."),
    }
