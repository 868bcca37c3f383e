"""Section (c): end-to-end training throughput.

1. Training tokens/s (forward, loss, backward, gradient clipping, AdamW) of the paper's seven
   architectures at one size: full attention, SWA-128/512/2048 hybrids and one hybrid per recurrent
   mixer registered in this install (``mixer_names``), side by side on the same random batches.
2. One CPU thread at the CPU replica's size (d=128, 4 layers, batch 8 x 512) and the demo's (d=64,
   batch 8 x 256): the CPU time of a training step of full attention, SWA-32 and every recurrent hybrid,
   fp32 and under bf16 autocast, side by side; ``train.precision: auto`` follows the bf16 column
   (each mixer definition's ``cpu_bf16_speedup``, ``hybrid_lightning/kinds/``).
3. The Lightning path (the ``Trainer`` that ``hybrid-lightning train`` builds: logging, checkpoint and
   throughput callbacks, the step sampler) against a plain PyTorch loop doing the same step on the
   same model, optimizer, schedule and batches, alternating rounds, the embedded default run config.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

from hybrid_lightning.bench.attention import WINDOWS
from hybrid_lightning.bench.measure import interleaved_medians, one_thread
from hybrid_lightning.config import RunConfig, config_to_dict, validate_config
from hybrid_lightning.kinds import KINDS, mixer_names
from hybrid_lightning.plan import build_model
from hybrid_lightning.plan.count import count_params

SIZE = {"n_layers": 4, "d_model": 256, "n_heads": 4}  # one size for all seven; Dh = 64
SEQ_LEN, BATCH = 4096, 1
TARGET_LIGHTNING = 0.9  # acceptance G2 of issue #8 (and A8 of the core issue)
# (label, model overrides, T) at batch 8; the replica's size and the demo's
CPU_SIZES = (("d=128", {"n_layers": 4, "d_model": 128, "n_heads": 4}, 512),
             ("d=64", {"n_layers": 4, "d_model": 64, "n_heads": 2}, 256))
CPU_BATCH, TARGET_RECURRENT_CPU = 8, 1.25  # a recurrent hybrid's step at most 1.25x full attention's


def architectures(windows: tuple[int, ...] = WINDOWS) -> dict[str, dict]:
    """Model-config overrides of the seven designs (3 efficient : 1 full layers for the hybrids; the
    recurrent hybrids parameter-matched to full attention). A windowed mixer with settings of its own (head-wise
    attention) is a variant of SWA, not one of the designs: not benched."""
    archs = {"full": {"pattern": "F"}}
    for mixer in mixer_names(efficient_only=True):
        if KINDS[mixer].has_window:
            if KINDS[mixer].section is None:
                archs.update({f"SWA-{w}": {"pattern": "EEEF", "mixer": mixer, "window": w} for w in windows})
        else:
            archs[f"{mixer} hybrid"] = {"pattern": "EEEF", "mixer": mixer, "match_params": "F"}
    return archs


class PlainStep:
    """One training step of ``LMSystem`` without Lightning: the same loss, clipping, optimizer and schedule."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, grad_clip: float | None):
        self.model, self.optimizer, self.scheduler, self.grad_clip = model, optimizer, scheduler, grad_clip

    def __call__(self, batch: torch.Tensor) -> float:
        x, y = batch[:, :-1], batch[:, 1:]  # (B, T)
        loss = F.cross_entropy(self.model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        return loss.item()


def random_batch(rows: int, T: int) -> torch.Tensor:
    """(rows, T + 1) byte-vocabulary tokens, the same at every call."""
    return torch.randint(0, 257, (rows, T + 1), generator=torch.Generator().manual_seed(0))


def seeded_step(model_cfg: dict) -> PlainStep:
    """The training step of a model of ``model_cfg`` built from seed 0: AdamW at 1e-4, no schedule, clipping at 1."""
    torch.manual_seed(0)
    model = build_model(model_cfg)
    return PlainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-4), None, 1.0)


def architecture_rows(quick: bool) -> list[dict]:
    size, T, windows = (({"n_layers": 4, "d_model": 64, "n_heads": 2}, 256, (32, 64, 128)) if quick
                        else (SIZE, SEQ_LEN, WINDOWS))
    batch = random_batch(BATCH, T)
    steps, params = {}, {}
    for name, arch in architectures(windows).items():
        step = seeded_step({**size, **arch})
        params[name] = count_params(step.model)["non_embedding"]
        step(batch)  # warm-up
        steps[name] = (lambda s: lambda: s(batch))(step)
    secs = interleaved_medians(steps, 1 if quick else 3)
    return [
        {"part": "architectures", "setting": name, "non-embedding params": params[name],
         "tokens/s": BATCH * T / secs[name].wall, "relative to full": secs["full"].wall / secs[name].wall,
         "tokens per CPU s": BATCH * T / secs[name].cpu}
        for name in steps
    ]


def autocast_step(step: PlainStep, batch: torch.Tensor, bf16: bool):
    """One step of ``step`` on ``batch``, under CPU bf16 autocast when ``bf16``."""
    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return step(batch)
    return run


def cpu_rows(quick: bool) -> list[dict]:
    """Per size and architecture: CPU ms per step on one thread, fp32 and bf16 autocast, interleaved."""
    rows = []
    with one_thread():
        for label, size, T in CPU_SIZES[1:] if quick else CPU_SIZES:
            T = 32 if quick else T
            batch = random_batch(CPU_BATCH, T)
            steps = {}
            for name, arch in architectures((32,)).items():
                step = seeded_step({**size, **arch})
                for bf16 in (False, True):
                    steps[name, bf16] = autocast_step(step, batch, bf16)
                    steps[name, bf16]()  # warm-up
            secs = interleaved_medians(steps, 1 if quick else 7)
            rows += [{"part": "CPU, one thread", "setting": f"{name}, {label}, batch {CPU_BATCH} x {T}",
                      "CPU ms/step": 1e3 * secs[name, False].cpu,
                      "step / full's": secs[name, False].cpu / secs["full", False].cpu,
                      "bf16 speed-up": secs[name, False].cpu / secs[name, True].cpu}
                     for name in architectures((32,))]
    return rows


class _StepTimer(L.Callback):
    """Wall-clock and process CPU seconds from the start of batch ``first`` to the end of the last batch."""

    def __init__(self, first: int):
        self.first, self.start, self.end = first, (0.0, 0.0), (0.0, 0.0)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == self.first:
            self.start = clocks()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.end = clocks()


def clocks() -> tuple[float, float]:
    """(wall-clock, CPU time of this process): CPU time is what the other processes of a shared machine
    cannot inflate."""
    return time.perf_counter(), time.process_time()


def lightning_seconds(cfg: RunConfig, plan, warm: int, run_dir: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of steps warm ... max_steps-1 of ``hybrid-lightning train``'s Trainer."""
    from hybrid_lightning.training.trainer import build_trainer, fit

    trainer, module, datamodule = build_trainer(cfg, plan, run_dir)
    timer = _StepTimer(warm)
    trainer.callbacks.append(timer)
    fit(trainer, module, datamodule, None)
    return timer.end[0] - timer.start[0], timer.end[1] - timer.start[1]


def plain_seconds(cfg: RunConfig, plan, warm: int) -> tuple[float, float]:
    """(wall, CPU) seconds of the same steps in a plain loop over the same batches."""
    from hybrid_lightning.data.datamodule import LMDataModule
    from hybrid_lightning.training.system import LMSystem

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    system = LMSystem(config_to_dict(cfg), plan.as_dict())
    opt = system.configure_optimizers()
    step = PlainStep(system.model, opt["optimizer"], opt["lr_scheduler"]["scheduler"], cfg.train.grad_clip)
    data = LMDataModule(cfg)
    data.setup("fit")
    system.model.train()
    start = (0.0, 0.0)
    for i, batch in enumerate(data.train_dataloader()):
        if i == warm:
            start = clocks()
        step(batch)
        if i == cfg.train.max_steps - 1:
            end = clocks()
            return end[0] - start[0], end[1] - start[1]
    raise AssertionError("the step sampler is endless")


def lightning_rows(quick: bool) -> list[dict]:
    from hybrid_lightning.plan.resolve import plan_run

    warm, measured, rounds = (2, 3, 1) if quick else (20, 100, 3)
    overrides = {"max_steps": warm + measured, "warmup_steps": 1, "progress_bar": False,
                 "val_every_n_steps": 10**6, "checkpoint_every_n_steps": 10**6}
    model = {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF"} if quick else {}
    if quick:
        overrides.update(batch_size=2, seq_len=64)
    no_eval = {"every_n_steps": 0, "at_end": False}  # the evaluation callbacks are measured in the eval section
    cfg, plan = plan_run(validate_config({"name": "bench", "model": model, "train": overrides,
                                          "eval": {**no_eval, "heads": no_eval}}))
    tokens = measured * plan.budget.tokens_per_step  # one process, one micro-batch a step
    runs: dict[str, list[tuple[float, float]]] = {"Lightning": [], "plain loop": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            runs["Lightning"].append(lightning_seconds(cfg, plan, warm, Path(tmp) / f"round{r}"))
            runs["plain loop"].append(plain_seconds(cfg, plan, warm))
    wall = {k: tokens / statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: tokens / statistics.median(c for _, c in v) for k, v in runs.items()}
    m = cfg.model
    setting = f"{m.n_layers} layers, d={m.d_model}, {m.pattern}, batch {cfg.train.batch_size} x {cfg.train.seq_len}"
    config = "a tiny config" if quick else "the default run config"
    rows = [{"part": "Lightning vs plain", "setting": f"{name}: {config} ({setting})",
             "tokens/s": wall[name], "tokens per CPU s": cpu[name]} for name in runs]
    rows[0]["Lightning / plain"] = wall["Lightning"] / wall["plain loop"]
    rows[0]["Lightning / plain (CPU s)"] = cpu["Lightning"] / cpu["plain loop"]
    return rows


def run(quick: bool) -> dict:
    archs, cpu, lightning = architecture_rows(quick), cpu_rows(quick), lightning_rows(quick)
    recurrent = [r["step / full's"] for r in cpu if "hybrid" in r["setting"]]
    T = 256 if quick else SEQ_LEN
    notes = (
        f"Architectures: {'a quick size' if quick else SIZE}, batch {BATCH} x {T} tokens, fp32, AdamW; median of "
        f"{1 if quick else 3} round-robin steps after a warm-up step; hybrids are 3 efficient : 1 full layers (EEEF). "
        "CPU, one thread: CPU time per step (forward, loss, backward, clipping, AdamW), medians of "
        f"{1 if quick else 7} interleaved steps, fp32; 'bf16 speed-up' is fp32 time / bf16-autocast time. The "
        f"recurrent hybrids take {min(recurrent):.2f}-{max(recurrent):.2f}x full attention's step (target <= "
        f"{TARGET_RECURRENT_CPU}). Lightning vs plain: medians over alternating rounds of the steps after a warm-up; "
        "'tokens per CPU s' divides by this process's CPU time, which the other processes of a shared machine do not "
        f"inflate. G2: the Lightning path reaches {lightning[0]['Lightning / plain']:.3f}x the plain loop's tokens/s "
        f"({lightning[0]['Lightning / plain (CPU s)']:.3f}x per CPU second; target >= {TARGET_LIGHTNING})."
    )
    return {
        "title": "(c) Training throughput",
        "columns": ["part", "setting", "non-embedding params", "tokens/s", "relative to full", "tokens per CPU s",
                    "CPU ms/step", "step / full's", "bf16 speed-up", "Lightning / plain", "Lightning / plain (CPU s)"],
        "rows": archs + cpu + lightning,
        "notes": notes,
    }
