"""Cost of one call of each evaluation callback (long-context evaluation, retrieval heads) at its
defaults, against the cost of a training step of the default run, all measured in this process on
the default model."""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from hybrid_lightning.config import validate_config
from hybrid_lightning.data.datamodule import LMDataModule
from hybrid_lightning.eval.heads import RetrievalHeads
from hybrid_lightning.eval.runner import LongContextEval
from hybrid_lightning.model import build_model
from hybrid_lightning.training.run import resolve_config


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(quick: bool) -> dict:
    cfg = resolve_config(validate_config({}))
    data = LMDataModule(cfg)
    data.setup()
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    batch = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.train.seq_len + 1))

    def train_step():
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()

    train_step()  # warm-up
    step = _median_seconds(train_step, 5 if quick else 20)
    e = cfg.eval
    parts = {
        f"eval call at the defaults ({len(e.tasks)} tasks x lengths {list(e.lengths)} x {len(e.depths)} depths, "
        f"{e.position_sequences} held-out sequences of {e.position_len})": e,
        "  probes only": e.model_copy(update={"position_sequences": 0}),
        "  per-position loss and LongPPL only": e.model_copy(update={"tasks": ()}),
    }
    rows = [{"measure": f"training step ({cfg.train.batch_size} x {cfg.train.seq_len}, forward, backward, AdamW)",
             "seconds": step, "training steps": 1.0}]
    evaluators = {name: LongContextEval(ecfg, data.tokenizer, data.val_tokens) for name, ecfg in parts.items()}
    h = e.heads
    heads = (f"retrieval-heads call at the defaults ({len(h.tasks)} tasks x lengths {list(h.lengths)} x {len(h.depths)} "
             f"depths, answers >= {h.value_tokens} tokens)")
    evaluators[heads] = RetrievalHeads(e, data.tokenizer, data.val_tokens)
    for name, ev in evaluators.items():
        ev.run(model, step=0, tokens=0)  # warm-up: word lists, first calls
        seconds = _median_seconds(lambda: ev.run(model, step=0, tokens=0), 1 if quick else 3)
        rows.append({"measure": name, "seconds": seconds, "training steps": seconds / step})
    longctx_share = rows[1]["seconds"] / (e.every_n_steps * step + rows[1]["seconds"])
    heads_share = rows[-1]["seconds"] / (h.every_n_steps * step + rows[-1]["seconds"])
    return {
        "title": "(d) Evaluation callbacks: cost per call",
        "columns": ["measure", "seconds", "training steps"],
        "rows": rows,
        "notes": (f"Default model and run config, CPU fp32, medians. At eval.every_n_steps={e.every_n_steps} one "
                  f"long-context call adds {100 * longctx_share:.1f}% to training time, at "
                  f"eval.heads.every_n_steps={h.every_n_steps} one retrieval-heads call {100 * heads_share:.1f}% "
                  "(their first calls also import matplotlib and load the word lists, not counted here)."),
    }
