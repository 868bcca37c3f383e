import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TINY, run_cli
from hybrid_lightning.config import PROVENANCE_KEY
from hybrid_lightning.plan import build_model
from hybrid_lightning.rundir.checkpoints import checkpoint_is_valid
from hybrid_lightning.rundir.files import read_config_dict, read_plan, read_run_config
from hybrid_lightning.rundir.status import read_status


def scalars(run_dir, tag):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.slow
def test_train_200_steps_loss_falls(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli("train", "--run-dir", str(run_dir), *TINY, "--set", "train.max_steps=200",
                "--set", "train.val_every_n_steps=100")
    assert r.returncode == 0, r.stderr[-3000:]
    loss = scalars(run_dir, "train/loss")
    assert loss[-1][0] == 200 and len(loss) == 20  # a step is the optimizer steps completed
    assert loss[-1][1] < 0.7 * loss[0][1], loss
    assert [s for s, _ in scalars(run_dir, "val/loss")] == [100, 200]
    for tag in ("train/lr", "train/tokens", "train/tokens_per_sec", "val/ppl", "val/synthetic_loss"):
        assert scalars(run_dir, tag), tag
    assert dict(scalars(run_dir, "train/tokens"))[200] == 200 * 8 * 128
    # the run-directory contract
    assert ((run_dir / "checkpoints" / "last.ckpt").is_file()
            and (run_dir / "checkpoints" / "step_0000100.ckpt").is_file())
    cfg = read_run_config(run_dir)
    assert cfg.train.max_steps == 200
    # the run plan: what analysis, export and the offline commands read instead of working it out again
    plan = read_plan(run_dir)
    model = build_model(plan)
    assert plan.params["total"] == sum(p.numel() for p in model.parameters())
    assert ([layer.params["total"] for layer in plan.layers]
            == [sum(p.numel() for p in b.parameters()) for b in model.layers])
    assert [(layer.letter, layer.window) for layer in plan.layers] == [("S", 32), ("F", None)]  # pattern EF
    assert plan.budget.tokens_per_step == 8 * 128 and plan.budget.max_steps == 200 and not plan.rebuilt
    assert set(read_config_dict(run_dir)[PROVENANCE_KEY]) == {"git_revision", "package_version", "written", "data"}
    assert read_status(run_dir)["state"] == "done"
    # running it again: nothing to do, exit 0
    again = run_cli("train", "--run-dir", str(run_dir), *TINY, "--set", "train.max_steps=200",
                    "--set", "train.val_every_n_steps=100")
    assert again.returncode == 0 and "already complete" in again.stdout
    # the same directory with another model is refused
    other = run_cli("train", "--run-dir", str(run_dir), *TINY, "--set", "train.max_steps=200",
                    "--set", "model.window=8")
    assert other.returncode == 2 and "model.window" in other.stderr


def _final_weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.slow
def test_resume_after_sigkill_is_exact(tmp_path):
    args = [*TINY, "--set", "train.max_steps=60", "--set", "train.checkpoint_every_n_steps=20",
            "--set", "train.log_every_n_steps=1", "--set", "train.val_every_n_steps=25",
            "--set", "train.warmup_steps=5"]
    straight = tmp_path / "straight"
    assert run_cli("train", "--run-dir", str(straight), *args).returncode == 0

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "hybrid_lightning", "train", "--run-dir", str(killed), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    ckpt = killed / "checkpoints" / "step_0000040.ckpt"
    deadline = time.time() + 300
    while not (ckpt.exists() and checkpoint_is_valid(ckpt)):
        assert proc.poll() is None and time.time() < deadline, "run ended before its second checkpoint"
        time.sleep(0.05)
    time.sleep(0.15)  # a few steps past the checkpoint
    assert proc.poll() is None, "run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert read_status(killed)["state"] == "interrupted"  # its process is gone

    r = run_cli("train", "--run-dir", str(killed), *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from" in r.stdout
    a, b = _final_weights(straight), _final_weights(killed)
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    for tag in ("train/loss", "val/loss"):
        sa, sb = scalars(straight, tag), scalars(killed, tag)
        assert [s for s, _ in sb] == [s for s, _ in sa]  # no duplicated, no missing steps
        assert sa == sb
