"""Budgets as decay branches of one stable phase (``train.stable_phase``, training/branch.py): a run started from
the checkpoint another budget published at its decay start ends bit-identical, in weights, optimizer and scheduler
state, to the same budget trained alone from step 0, also after a SIGKILL inside the branch; and it trains only its
decay."""

import pytest
import torch

from hybrid_lightning.config import validate_config
from hybrid_lightning.config.schedule import decay_start
from hybrid_lightning.rundir.status import read_status
from hybrid_lightning.training.run import train
from test_accumulation import NO_EVAL, scalars

LONG, SHORT = 11, 10  # WSD over 20% of the steps: the long run decays from step 9, the short one from step 8


def tiny(steps: int, accumulate: int, phase: str | None, publish: tuple[int, ...] = ()) -> dict:
    return {
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "window": 16},
        "data": {"max_tokens": 200_000},
        "train": {"max_steps": steps, "batch_size": 6 // accumulate, "accumulate_grad_batches": accumulate,
                  "seq_len": 64, "warmup_steps": 2, "schedule": "wsd", "log_every_n_steps": 1,
                  "val_every_n_steps": 100, "val_batches": 1, "checkpoint_every_n_steps": 4, "progress_bar": False,
                  "precision": "32", "lr": 1e-2,
                  "stable_phase": None if phase is None else {"dir": phase, "publish": list(publish)}},
        "eval": {**NO_EVAL, "heads": NO_EVAL},
    }


def state(run_dir) -> dict[str, torch.Tensor]:
    """Weights, the optimizer's moments and step counts, and the learning rates of the run's last checkpoint."""
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    optim = ckpt["optimizer_states"][0]
    out = {f"w.{k}": v for k, v in ckpt["state_dict"].items()}
    out |= {f"o.{k}.{n}": v for k, s in optim["state"].items() for n, v in s.items()}
    out |= {f"lr.{i}": torch.tensor(g["lr"], dtype=torch.float64) for i, g in enumerate(optim["param_groups"])}
    sched = ckpt["lr_schedulers"][0]
    return out | {"sched.last_lr": torch.tensor(sched["_last_lr"], dtype=torch.float64),
                  "sched.last_epoch": torch.tensor(sched["last_epoch"])}


def identical(a: dict, b: dict) -> bool:
    assert a.keys() == b.keys()
    return all(torch.equal(a[k], b[k]) for k in a)


def branch_and_alone(tmp_path, accumulate: int):
    """The long run publishing at the short one's decay start, the short one from there, and the short one alone."""
    phase = str(tmp_path / "stable")
    start = decay_start(validate_config(tiny(SHORT, accumulate, None)).train)
    train(validate_config(tiny(LONG, accumulate, phase, (start,))), tmp_path / "long")
    return phase, start, tmp_path / "short", tmp_path / "alone"


@pytest.mark.slow  # three tiny runs: about 30 s of CPU
@pytest.mark.parametrize("accumulate", [1, 3])
def test_a_branch_from_the_stable_phase_equals_its_budget_trained_alone(tmp_path, accumulate, capsys):
    phase, start, short, alone = branch_and_alone(tmp_path, accumulate)
    assert (tmp_path / "stable" / f"step_{start:07d}.ckpt").stat().st_nlink >= 1
    train(validate_config(tiny(SHORT, accumulate, phase)), short)
    assert f"branching from {phase}/step_{start:07d}.ckpt at step {start}" in capsys.readouterr().out
    train(validate_config(tiny(SHORT, accumulate, None)), alone)
    assert identical(state(short), state(alone))
    assert sorted(scalars(short, "train/loss")) == list(range(start + 1, SHORT + 1))  # only its decay trained
    assert scalars(short, "train/loss") == {s: v for s, v in scalars(alone, "train/loss").items() if s > start}


@pytest.mark.slow
def test_a_branch_without_a_published_stable_phase_trains_from_step_0(tmp_path):
    train(validate_config(tiny(4, 1, str(tmp_path / "stable"))), tmp_path / "run")
    assert sorted(scalars(tmp_path / "run", "train/loss")) == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_stable_phase_of_another_model_is_refused(tmp_path):
    phase, start, short, _ = branch_and_alone(tmp_path, 1)
    other = tiny(SHORT, 1, phase)
    other["model"]["d_model"] = 64
    with pytest.raises(ValueError, match=r"model\.d_model: 32 -> 64.*stable phase of another run"):
        train(validate_config(other), short)


@pytest.mark.slow
def test_a_branch_killed_inside_its_decay_resumes_to_its_budget_trained_alone(tmp_path):
    """SIGKILL once the branch has written its first checkpoint of the decay, then run it to the end."""
    from test_faults import start as start_cli
    from test_kill_loops import kill_when

    phase, start, short, alone = branch_and_alone(tmp_path, 1)
    raw = tiny(SHORT, 1, phase)
    raw["train"]["checkpoint_every_n_steps"] = 1
    (tmp_path / "short.yaml").write_text(__import__("yaml").safe_dump(raw))
    killed = kill_when(short, [str(tmp_path / "short.yaml")],
                       lambda: any((short / "checkpoints").glob(f"step_{start + 1:07d}.ckpt")))
    assert killed and read_status(short)["state"] == "running"
    assert start_cli(short, str(tmp_path / "short.yaml")).wait() == 0
    assert read_status(short)["state"] == "done"
    train(validate_config(raw | {"train": {**raw["train"], "stable_phase": None}}), alone)
    assert identical(state(short), state(alone))
