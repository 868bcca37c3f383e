"""Checkpoints fall on optimizer-step boundaries only, so a run killed again and again, at any gradient
accumulation, resumes to the weights, optimizer state and losses of the uninterrupted run; and the keys the docs
call resumable (``train.keep_checkpoints`` among them) change on resume without a crash."""

import random
import signal
import time
from pathlib import Path

import pytest
import torch

from conftest import TINY
from hybrid_lightning.rundir.status import read_status
from test_faults import QUIET, loss_steps, one_line_error, start, train

STEPS, EVERY = 12, 2


def run_args(accumulate: int, steps: int = STEPS, *extra: str) -> list[str]:
    """The tiny model at a global batch of 12 sequences: 12 / ``accumulate`` per micro-batch."""
    return [*TINY, *QUIET, "--set", f"train.batch_size={12 // accumulate}",
            "--set", f"train.accumulate_grad_batches={accumulate}",
            "--set", f"train.max_steps={steps}", "--set", f"train.checkpoint_every_n_steps={EVERY}",
            "--set", "train.log_every_n_steps=1", "--set", "train.precision='32'", *extra]


def state(run: Path) -> tuple[dict, dict]:
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    optim = ckpt["optimizer_states"][0]["state"]
    return ckpt["state_dict"], {f"{k}.{n}": v for k, s in optim.items() for n, v in s.items() if torch.is_tensor(v)}


def worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def kill_when(run: Path, args: list[str], changed) -> bool:
    """Starts the run and SIGKILLs it as soon as ``changed()`` holds (False: it finished first)."""
    proc = start(run, *args)
    while proc.poll() is None:
        if changed():
            time.sleep(random.uniform(0.0, 0.05))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.005)
    proc.communicate()
    return False


@pytest.mark.slow
@pytest.mark.parametrize("accumulate, mixer", [(1, "swa"), (3, "swa"), (4, "swa"), (1, "kda"),
                                               (1, "gated_deltaproduct")])
def test_repeated_kills_resume_exactly_at_any_accumulation(tmp_path, accumulate, mixer):
    """Kill -9 when the first step checkpoint appears; then, again and again, as soon as the resumed process writes
    ``last.ckpt`` (before the fix it rewrote it after its first micro-batch, inside an accumulation window); then
    run to the end: equal to the uninterrupted run. Also with the recurrent mixers that carry no other test of it."""
    random.seed(accumulate)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    args = run_args(accumulate, STEPS, "--set", f"model.mixer={mixer}")
    assert train(straight, *args).returncode == 0
    last = killed / "checkpoints" / "last.ckpt"
    kills = int(kill_when(killed, args, lambda: any((killed / "checkpoints").glob("step_*.ckpt"))))
    for _ in range(4):
        before = mtime(last)
        kills += kill_when(killed, args, lambda before=before: mtime(last) not in (None, before))
    r = train(killed, *args)
    assert r.returncode == 0 and read_status(killed)["state"] == "done", r.stderr[-3000:]
    assert kills >= 3, kills  # the loop did kill the runs it meant to
    (w_a, o_a), (w_b, o_b) = state(straight), state(killed)
    assert worst(w_a, w_b) == 0.0 and worst(o_a, o_b) == 0.0
    assert loss_steps(killed) == list(range(1, STEPS + 1))
    for ckpt in (killed / "checkpoints").glob("step_*.ckpt"):  # every checkpoint at a boundary: its own step
        loop = torch.load(ckpt, map_location="cpu",
                          weights_only=False)["loops"]["fit_loop"]["epoch_loop.batch_progress"]
        step = int(ckpt.stem.split("_")[1])
        assert loop["total"]["started"] == step * accumulate, (ckpt.name, loop)  # saved as its last micro-batch ends


@pytest.mark.slow
def test_resumable_keys_change_on_resume(tmp_path):
    """train.keep_checkpoints lowered and raised, the cadences and the checkpoint interval changed: each resume
    trains on; the step files kept are the newest."""
    run = tmp_path / "run"
    constant = ["--set", "train.schedule=constant"]
    assert train(run, *run_args(1, 10), *constant).returncode == 0
    assert len(list((run / "checkpoints").glob("step_*.ckpt"))) == 5  # keep_checkpoints 5, every 2 of 10 steps
    r = train(run, *run_args(1, 14), *constant, "--set", "train.keep_checkpoints=1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*.ckpt")) == ["step_0000014.ckpt"]
    r = train(run, *run_args(1, 18), *constant, "--set", "train.keep_checkpoints=-1",
              "--set", "train.checkpoint_every_n_steps=1",
              "--set", "train.log_every_n_steps=3", "--set", "train.val_every_n_steps=5",
              "--set", "train.progress_bar=true")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (sorted(p.name for p in (run / "checkpoints").glob("step_*.ckpt"))
            == [f"step_{s:07d}.ckpt" for s in (14, 15, 16, 17, 18)])
    assert "Restoring states" not in r.stdout + r.stderr  # the run's own "resuming from ..." line says it
    refused = train(run, *run_args(1, 20), *constant, "--set", "model.window=16")
    assert "another config" in one_line_error(refused)
