"""Cost of one call of each evaluation callback (long-context evaluation, retrieval heads) at its
defaults, against the cost of a training step of the default run, all measured in this process on
the default model."""

from __future__ import annotations

import functools
import statistics
import time

import torch
import torch.nn.functional as F

from hybrid_lightning.config import validate_config
from hybrid_lightning.data.datamodule import LMDataModule
from hybrid_lightning.eval.runner import LongContextEval
from hybrid_lightning.heads.retrieval import RetrievalHeads
from hybrid_lightning.plan import build_model
from hybrid_lightning.plan.resolve import plan_run


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(quick: bool) -> dict:
    cfg, plan = plan_run(validate_config({}))
    data = LMDataModule(cfg)
    data.setup()
    torch.manual_seed(0)
    model = build_model(plan)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    batch = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.train.seq_len + 1))

    def train_step():
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()

    train_step()  # warm-up
    step = _median_seconds(train_step, 5 if quick else 20)
    e, h = cfg.eval, cfg.eval.heads
    probes = LongContextEval(e.model_copy(update={"position_sequences": 0}), data.tokenizer, data.val_tokens,
                             window=plan.window)
    calls = {  # measure -> one call
        f"eval call at the defaults without generation ({len(e.tasks)} tasks x lengths {list(e.lengths)} x "
        f"{len(e.depths)} depths, {e.position_sequences} held-out sequences of {e.position_len})":
            functools.partial(LongContextEval(e, data.tokenizer, data.val_tokens, window=plan.window).run,
                              generate=False),
        "  probes only": functools.partial(probes.run, generate=False),
        "  per-position loss and LongPPL only": LongContextEval(e.model_copy(update={"tasks": ()}), data.tokenizer,
                                                               data.val_tokens, window=plan.window).run,
        "probes with generation (greedy, RULER's new tokens per task)": probes.run,
        f"retrieval-heads call at the defaults ({len(h.tasks)} tasks x lengths {list(h.lengths)} x {len(h.depths)} "
        f"depths, answers >= {h.value_tokens} tokens)": RetrievalHeads(e, data.tokenizer, data.val_tokens).run,
    }
    rows = [{"measure": f"training step ({cfg.train.batch_size} x {cfg.train.seq_len}, forward, backward, AdamW)",
             "seconds": step, "training steps": 1.0}]
    for name, call in calls.items():
        call(model, step=0, tokens=0)  # warm-up: word lists, first calls
        seconds = _median_seconds(lambda call=call: call(model, step=0, tokens=0), 1 if quick else 3)
        rows.append({"measure": name, "seconds": seconds, "training steps": seconds / step})
    seconds = [r["seconds"] for r in rows]
    generation = max(0.0, seconds[4] - seconds[2])  # what decoding adds to the probes
    rows.insert(5, {"measure": "  of which generation", "seconds": generation, "training steps": generation / step})
    # evaluation seconds per training second at the default cadences
    longctx = seconds[1] / (e.every_n_steps * step) + generation / (e.generate_every_n_steps * step)
    heads = seconds[-1] / (h.every_n_steps * step)
    share = {name: x / (1 + x) for name, x in (("longctx", longctx), ("heads", heads), ("both", longctx + heads))}
    return {
        "title": "(d) Evaluation callbacks: cost per call",
        "columns": ["measure", "seconds", "training steps"],
        "rows": rows,
        "notes": (f"Default model and run config, CPU fp32, medians. The long-context evaluation every "
                  f"{e.every_n_steps} steps, with generation every {e.generate_every_n_steps}, adds "
                  f"{100 * share['longctx']:.1f}% to training time; the retrieval heads every {h.every_n_steps} steps "
                  f"{100 * share['heads']:.1f}%; both {100 * share['both']:.1f}% (their first calls also import "
                  "matplotlib and load the word lists, not counted here)."),
    }
