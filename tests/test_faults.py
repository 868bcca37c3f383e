"""Fault injection on real runs of the tiny model: each case breaks a run the way clusters and users
do (a moved directory, two commands at once, a kill while a checkpoint is written with $TMPDIR on
another filesystem, an unwritable or full disk, damaged checkpoints, SIGTERM/SIGINT, a lost
config.yaml, bad input files) and checks that nothing trained is lost and every error is one line."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TINY, run_cli
from hybrid_lightning.fileio import LOCK_FILE
from hybrid_lightning.rundir.checkpoints import checkpoint_is_valid
from hybrid_lightning.rundir.status import read_status

QUIET = ["--set", "eval.every_n_steps=0", "--set", "eval.at_end=false", "--set", "eval.heads.every_n_steps=0",
         "--set", "eval.heads.at_end=false", "--set", "train.warmup_steps=2", "--set", "train.val_every_n_steps=1000",
         "--set", "train.schedule=constant"]  # constant: a run may be extended (training/run.py check_extension)


def args(steps: int, every: int = 10, *extra: str) -> list[str]:
    return [*TINY, *QUIET, "--set", f"train.max_steps={steps}", "--set", f"train.checkpoint_every_n_steps={every}",
            "--set", "train.log_every_n_steps=1", *extra]


def train(run_dir: Path, *a: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli("train", "--run-dir", str(run_dir), *a, env=env)


def start(run_dir: Path, *a: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hybrid_lightning", "train", "--run-dir", str(run_dir), *a]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float = 300) -> int:
    """Waits until status.json shows at least ``step``; returns the step shown."""
    deadline = time.time() + timeout
    while True:
        now = (read_status(run_dir) or {}).get("step") or 0
        if (read_status(run_dir) or {}).get("state") == "running" and now >= step:
            return now
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "the run did not reach the step in time"
        time.sleep(0.05)


def stored_step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


def loss_steps(run_dir: Path) -> list[int]:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars("train/loss")]


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


def leftovers(tmpdir: Path) -> list[Path]:
    """Files in ``tmpdir`` other than torch's compile cache (``torchinductor_<user>/``)."""
    return [p for p in tmpdir.rglob("*")
            if p.is_file() and not p.relative_to(tmpdir).parts[0].startswith("torchinductor_")]


def mount_tmpfs(folder: Path, size: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                       text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")


@pytest.fixture
def mounts():
    """Folders to unmount at the end of the test."""
    folders: list[Path] = []
    yield folders
    for folder in reversed(folders):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.mark.slow
def test_moved_run_directory_resumes_from_its_newest_step(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    keep = ("--set", "train.keep_checkpoints=2")
    assert train(a, *args(10, 5, *keep)).returncode == 0
    shutil.move(a, b)
    r = train(b, *args(20, 5, *keep))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "at step 10" in r.stdout and "dirpath has changed" not in r.stderr
    r = train(b, *args(25, 5, *keep))
    assert r.returncode == 0 and "at step 20" in r.stdout, r.stdout + r.stderr[-3000:]
    names = sorted(p.name for p in (b / "checkpoints").iterdir())
    assert names == ["last.ckpt", "step_0000020.ckpt", "step_0000025.ckpt"], names  # one name per step, 2 kept
    assert stored_step(b / "checkpoints" / "last.ckpt") == 25
    assert loss_steps(b) == list(range(1, 26))


@pytest.mark.slow
def test_concurrent_train_is_refused_and_a_dead_holder_taken_over(tmp_path):
    run = tmp_path / "run"
    first = start(run, *args(100000, 5))
    try:
        wait_for_step(first, run, 11)  # the checkpoint of step 10 is on disk before the status shows 11
        line = one_line_error(train(run, *args(100000, 5, "--set", "model.window=16")))
        assert f"pid {first.pid}" in line and "in use" in line
        assert json.loads((run / LOCK_FILE).read_text())["pid"] == first.pid
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate()
    r = train(run, *args(10, 5))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"stale lock (pid {first.pid}" in r.stdout and "already complete" in r.stdout
    assert not (run / LOCK_FILE).exists()
    status = read_status(run)
    assert status["state"] == "done" and status["pid"] == first.pid  # the process that trained it stays recorded


@pytest.mark.slow
def test_kill_while_checkpointing_with_tmpdir_elsewhere(tmp_path, mounts):
    tmpdir = tmp_path / "node-local"
    mount_tmpfs(tmpdir, "64m")
    mounts.append(tmpdir)
    run = tmp_path / "run"
    env = {"TMPDIR": str(tmpdir)}
    for kill_at, delay in ((5, 0.0), (11, 0.011), (17, 0.023)):  # a checkpoint every step: kills land in writes
        proc = start(run, *args(30, 1), env=env)
        wait_for_step(proc, run, kill_at)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        for ckpt in (run / "checkpoints").glob("*.ckpt"):
            assert checkpoint_is_valid(ckpt), ckpt
        assert not leftovers(tmpdir)
    r = train(run, *args(30, 1), env=env)
    assert r.returncode == 0 and "resuming from" in r.stdout, r.stderr[-3000:]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # the killed writes' temporaries
    assert not leftovers(tmpdir)
    assert loss_steps(run) == list(range(1, 31))
    assert stored_step(run / "checkpoints" / "last.ckpt") == 30


def _read_only(folder: Path, mounts: list) -> None:
    if os.geteuid():
        folder.chmod(0o555)
        return
    for cmd in (["mount", "--bind", str(folder), str(folder)], ["mount", "-o", "remount,bind,ro", str(folder)]):
        if subprocess.run(cmd, capture_output=True).returncode:
            pytest.skip("root ignores permissions and a read-only bind mount failed")
        if folder not in mounts:
            mounts.append(folder)


@pytest.mark.slow
def test_unwritable_checkpoints_are_refused_before_training(tmp_path, mounts):
    """A checkpoints folder nothing can be written in is refused when the run starts (preflight), not at its first
    save: one line naming the folder, the run as it was (a failed write mid-run: the full-disk test below)."""
    run = tmp_path / "run"
    assert train(run, *args(10, 5)).returncode == 0
    _read_only(run / "checkpoints", mounts)
    r = train(run, *args(20, 5))
    line = one_line_error(r)
    assert r.returncode == 2 and "checkpoints" in line and "nothing can be written" in line, line
    status = read_status(run)
    assert status["state"] == "done" and status["step"] == 10  # untouched: where a rerun resumes
    assert stored_step(run / "checkpoints" / "last.ckpt") == 10
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


@pytest.mark.slow
def test_full_disk_fails_cleanly_and_resumes_once_freed(tmp_path, mounts):
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "6m")  # two 1.7 MB checkpoints and the run's small files; the fourth file does not fit
    mounts.append(disk)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    run = disk / "run"
    r = train(run, *args(30, 5), env={"TMPDIR": str(tmpdir)})
    line = one_line_error(r)
    assert "No space left on device" in line and "errno 28" in line and "free space" in line, line
    status = read_status(run)
    assert status["state"] == "failed" and "ENOSPC" in status["error"]
    valid = {p.name: stored_step(p) for p in (run / "checkpoints").glob("*.ckpt") if checkpoint_is_valid(p)}
    # the step-10 save failed half way: its step_10 file is dropped too, last.ckpt of step 5 is intact
    assert valid == {"last.ckpt": 5, "step_0000005.ckpt": 5}, valid
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")] and not leftovers(tmpdir)
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
    r = train(run, *args(30, 5))
    assert r.returncode == 0 and "at step 5" in r.stdout, r.stderr[-3000:]
    assert loss_steps(run) == list(range(1, 31))


@pytest.mark.slow
def test_damaged_checkpoints(tmp_path):
    run = tmp_path / "run"
    assert train(run, *args(20, 10)).returncode == 0
    for name in ("last.ckpt", "step_0000020.ckpt"):
        path = run / "checkpoints" / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    r = train(run, *args(30, 10))
    assert r.returncode == 0 and "from step_0000010.ckpt at step 10" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "skipping damaged checkpoint" in r.stderr
    assert loss_steps(run) == list(range(1, 31))
    for path in (run / "checkpoints").glob("*.ckpt"):
        path.write_bytes(b"")
    line = one_line_error(train(run, *args(40, 10)))
    assert "every checkpoint is damaged" in line and "step_0000010.ckpt" in line


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.slow
def test_signal_saves_the_step_reached(tmp_path, sig, code):
    run = tmp_path / "run"
    proc = start(run, *args(100000, 1000))
    wait_for_step(proc, run, 12)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and "run the same command again to resume" in err
    status = read_status(run)
    step = stored_step(run / "checkpoints" / "last.ckpt")
    assert status["state"] == "interrupted" and status["step"] == step >= 12
    assert status["error"] == signal.Signals(sig).name
    r = train(run, *args(step + 3, 1000))
    assert r.returncode == 0 and f"at step {step}" in r.stdout, r.stderr[-3000:]
    assert loss_steps(run) == list(range(1, step + 4))


@pytest.mark.slow
def test_lost_config_yaml_resumes_only_the_same_model(tmp_path):
    run = tmp_path / "run"
    assert train(run, *args(10, 10)).returncode == 0
    (run / "config.yaml").unlink()
    line = one_line_error(train(run, *args(20, 10, "--set", "model.window=8")))
    assert "model.window: 32 -> 8" in line and "last.ckpt" in line
    r = train(run, *args(20, 10, "--set", "train.progress_bar=true"))
    assert r.returncode == 0 and "at step 10" in r.stdout, r.stderr[-3000:]
    assert (run / "config.yaml").is_file()
    bar = (r.stdout + r.stderr).replace("\r", "\n")
    assert "| 10/20 [" in bar and "train: 100%" in bar and "| 20/20 [" in bar  # steps of max_steps after a resume
    assert "Tip" not in r.stderr and "deprecated" not in r.stderr  # no third-party noise in the log


@pytest.mark.slow
def test_bad_inputs_are_one_line_and_create_nothing(tmp_path):
    run = tmp_path / "run"
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  window: 8\n  pattern: [EF\n")
    line = one_line_error(train(run, str(bad), *args(10)))
    assert str(bad) in line and "not valid YAML" in line and "line 4" in line
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"base: {bad.name}\naxes:\n  model.window: [8, 16]\n")
    line = one_line_error(run_cli("grid", "plan", str(grid)))
    assert "not valid YAML" in line and "base" in line
    for setting in ("model.window=true", "train.max_steps=false", "train.betas=[true,0.9]", "train.progress_bar=1"):
        line = one_line_error(train(run, *args(10), "--set", setting))
        assert setting.split("=")[0].split(".")[1] in line, line
    assert not run.exists()
