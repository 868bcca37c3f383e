"""The GPU check's last section: a short ``hybrid-lightning train`` killed with SIGKILL a few steps after
a checkpoint, then resumed, against a straight run of the same config: the same final weights and the
same logged training and validation losses at the same steps (none missing, none twice)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from hybrid_lightning.records import Tag
from hybrid_lightning.rundir import CKPT_DIR, step_checkpoint_name
from hybrid_lightning.rundir.checkpoints import checkpoint_is_valid

# killed just after the step-20 checkpoint (every 10 steps); 80 steps to spare, so that a fast device cannot finish
# first
MAX_STEPS, KILL_AFTER = 100, 20
TOLERANCE = 1e-6  # largest weight difference allowed: float reordering leaves ~1e-7, a wrong step ~lr
ARGS = [
    "--set", "model.n_layers=2", "--set", "model.d_model=64", "--set", "model.n_heads=2", "--set", "model.pattern=EF",
    "--set", "model.window=32", "--set", "train.batch_size=4", "--set", "train.seq_len=64",
    "--set", f"train.max_steps={MAX_STEPS}", "--set", "train.checkpoint_every_n_steps=10",
    "--set", "train.log_every_n_steps=1", "--set", "train.val_every_n_steps=15", "--set", "train.warmup_steps=3",
    "--set", "train.progress_bar=false", "--set", "data.max_tokens=2000000", "--set", "eval.every_n_steps=0",
    "--set", "eval.at_end=false", "--set", "eval.heads.every_n_steps=0", "--set", "eval.heads.at_end=false",
]


def command(run_dir: Path, accelerator: str) -> list[str]:
    return [sys.executable, "-m", "hybrid_lightning", "train", "--run-dir", str(run_dir), *ARGS,
            "--set", f"train.accelerator={accelerator}"]


def kill_after_checkpoint(run_dir: Path, accelerator: str, timeout: float = 600) -> bool:
    """Starts the run and SIGKILLs it a moment after its step-``KILL_AFTER`` checkpoint is whole;
    False when it ended (or timed out, or reached its last step) before it was killed."""
    proc = subprocess.Popen(command(run_dir, accelerator), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=os.environ.copy())
    ckpt = run_dir / CKPT_DIR / step_checkpoint_name(KILL_AFTER)
    deadline = time.monotonic() + timeout
    while not (ckpt.exists() and checkpoint_is_valid(ckpt)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            return False
        time.sleep(0.05)
    time.sleep(0.05)  # a few steps past the checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return not (run_dir / CKPT_DIR / step_checkpoint_name(MAX_STEPS)).exists()  # killed before its last step


def losses(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def resume_check(root: Path, accelerator: str) -> dict:
    """Straight run, killed run, resumed run, compared; ``ok`` when all agree within ``TOLERANCE``."""
    t0 = time.perf_counter()
    straight, killed = root / "straight", root / "killed"
    first = subprocess.run(command(straight, accelerator), capture_output=True, text=True)
    if first.returncode != 0:
        return {"ok": False, "error": f"straight run failed: {first.stderr[-2000:]}"}
    if not kill_after_checkpoint(killed, accelerator):
        return {"ok": False, "error": f"the run ended before it could be killed after step {KILL_AFTER}"}
    resumed = subprocess.run(command(killed, accelerator), capture_output=True, text=True)
    if resumed.returncode != 0 or "resuming from" not in resumed.stdout:
        return {"ok": False, "error": f"resume failed: {resumed.stdout[-1000:]} {resumed.stderr[-2000:]}"}
    a, b = (torch.load(d / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
            for d in (straight, killed))
    weights = max((a[k].float() - b[k].float()).abs().max().item() for k in a) if a.keys() == b.keys() else float("inf")
    logged = {tag: (losses(straight, tag), losses(killed, tag)) for tag in (Tag.LOSS, Tag.VAL_LOSS)}
    same = {tag: a == b for tag, (a, b) in logged.items()}
    return {"ok": weights <= TOLERANCE and all(same.values()), "accelerator": accelerator,
            "killed after step": KILL_AFTER, "steps": MAX_STEPS, "max weight difference": weights,
            "train losses equal": same[Tag.LOSS], "val losses equal": same[Tag.VAL_LOSS],
            **{f"{name} losses differ": differences(*logged[tag])
               for name, tag in (("train", Tag.LOSS), ("val", Tag.VAL_LOSS)) if not same[tag]},
            "seconds": round(time.perf_counter() - t0, 1)}


def differences(straight: list[tuple[int, float]], resumed: list[tuple[int, float]]) -> dict:
    """Where two logged series disagree: steps logged by one run only or more than once, and the steps whose values
    differ, with the largest difference."""
    a, b = dict(straight), dict(resumed)
    differ = sorted(s for s in a.keys() & b.keys() if a[s] != b[s])
    return {"straight only": sorted(a.keys() - b.keys()), "resumed only": sorted(b.keys() - a.keys()),
            "logged twice": sorted(s for s, n in Counter(s for s, _ in resumed).items() if n > 1),
            "values differ at": differ[:20], "largest difference": max((abs(a[s] - b[s]) for s in differ), default=0.0)}
