"""The threads of a training process (training/threads.py), the same for ``train``, its dry run and a grid's cells,
and a dry run that measures runs together, so that runs of equal cost get equal estimates."""

import os

import pytest
import torch

from conftest import TINY, run_cli
from hybrid_lightning.config import load_config, validate_config
from hybrid_lightning.plan.resolve import plan_run
from hybrid_lightning.training import dryrun
from hybrid_lightning.training.threads import cores_given, set_threads, share, thread_count


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})


def train_of(**settings):
    return validate_config({"train": settings}).train


def test_the_threads_come_from_the_config_the_environment_or_the_cores_given(four_cores, monkeypatch):
    assert cores_given() == 4 and thread_count(train_of()) == 4
    assert thread_count(train_of(accelerator="cpu", devices=2)) == 2  # two processes share the node's cores
    assert share(3) == 1 and share(8) == 1  # at least one
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")  # what SLURM gave, not what the node has
    assert cores_given() == 6 and thread_count(train_of()) == 6
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # set by a user or by the local executor for its cells
    assert thread_count(train_of()) == 3
    assert thread_count(train_of(threads=1)) == 1  # the config's key decides
    with pytest.raises(ValueError, match="train.threads must be at least 1"):
        train_of(threads=0)


def test_set_threads_sets_torchs(four_cores):
    before = torch.get_num_threads()
    try:
        assert set_threads(train_of(threads=1)) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_train_and_its_dry_run_use_the_configs_threads(tmp_path):
    env = {"OMP_NUM_THREADS": "2"}
    r = run_cli("train", *TINY, "--set", "train.max_steps=2", "--set", "train.warmup_steps=0",
                "--set", "train.threads=1", "--set", "eval.every_n_steps=0", "--set", "eval.at_end=false",
                "--set", "eval.heads.every_n_steps=0", "--set", "eval.heads.at_end=false",
                "--run-dir", str(tmp_path / "run"), env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "from step 0, 1 CPU thread" in r.stdout
    r = run_cli("train", *TINY, "--set", "train.max_steps=2", "--set", "train.warmup_steps=0", "--dry-run", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tokens/s on cpu (batch 8, 2 threads, median of 7 steps)" in r.stdout, r.stdout + r.stderr


def test_runs_are_measured_together_in_rounds_and_equal_steps_once(monkeypatch):
    base = load_config(None, [*TINY[1::2], "train.max_steps=5", "train.warmup_steps=0"])
    runs = [plan_run(base.model_copy(update=update)) for update in
            ({"name": "a"}, {"name": "b", "seed": 3},
             {"name": "c", "model": base.model.model_copy(update={"window": 16})})]
    order = []

    def fake_step(cfg, plan, device):
        seconds = iter([9.0] * dryrun.WARMUP_STEPS + [1.0, 2.0, 100.0, 2.0, 3.0, 2.0, 2.0])  # medians 2 s
        return lambda: order.append(cfg.model.window) or next(seconds)

    monkeypatch.setattr(dryrun, "_training_step", fake_step)
    a, b, c = dryrun.estimates(runs)
    assert a == b  # a seed and a name change no step: measured once
    assert a.tokens_per_s == c.tokens_per_s == 8 * 128 / 2.0  # the median: one slow step moves nothing
    timed = order[2 * dryrun.WARMUP_STEPS:]
    assert timed == [32, 16] * dryrun.MEASURED_STEPS  # rounds: one step of each run in turn
