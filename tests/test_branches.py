"""Budgets as decay branches of one stable phase (``train.stable_phase``, training/branch.py): a run started from
the checkpoint another budget published at its decay start ends bit-identical, in weights, optimizer and scheduler
state, to the same budget trained alone from step 0, also after a SIGKILL inside the branch; and it trains only its
decay."""

import pytest
import torch

from hybrid_lightning.config import validate_config
from hybrid_lightning.config.schedule import decay_start
from hybrid_lightning.grid import local
from hybrid_lightning.grid.branches import launch_order, ready
from hybrid_lightning.grid.report import plan_rows, plan_table
from hybrid_lightning.grid.spec import load_grid
from hybrid_lightning.rundir.status import read_status
from hybrid_lightning.training.branch import branch_point
from hybrid_lightning.training.run import train
from test_accumulation import NO_EVAL, scalars
from test_grid import TINY_BASE, write_grid

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


def branch_and_alone(tmp_path, accumulate: int, long: int = LONG, short: int = SHORT):
    """The long run publishing at the short one's decay start, the short one from there, and the short one alone."""
    phase = str(tmp_path / "stable")
    start = decay_start(validate_config(tiny(short, accumulate, None)).train)
    train(validate_config(tiny(long, accumulate, phase, (start,))), tmp_path / "long")
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

    steps = 40  # a decay of 8 steps: the kill after its first lands well before the run ends, also on a busy machine
    phase, start, short, alone = branch_and_alone(tmp_path, 1, steps + 1, steps)
    raw = tiny(steps, 1, phase)
    # a checkpoint and a validation every step: each step takes long enough for the kill to land before it ends
    raw["train"].update(checkpoint_every_n_steps=1, val_every_n_steps=1, val_batches=8)
    (tmp_path / "short.yaml").write_text(__import__("yaml").safe_dump(raw))
    killed = kill_when(short, [str(tmp_path / "short.yaml")],
                       lambda: any((short / "checkpoints").glob(f"step_{start + 1:07d}.ckpt")))
    assert killed and read_status(short)["step"] < steps
    assert start_cli(short, str(tmp_path / "short.yaml")).wait() == 0
    assert read_status(short)["state"] == "done"
    train(validate_config(raw | {"train": {**raw["train"], "stable_phase": None}}), alone)
    assert identical(state(short), state(alone))


WSD_BASE = {**TINY_BASE, "train": {**TINY_BASE["train"], "schedule": "wsd"}}


def test_a_grid_shares_one_stable_phase_per_model_and_seed_and_plans_the_tokens_saved(tmp_path):
    """Six budgets at a 20% decay: the longest run's 1,000 steps and the others' decays, 1,300 steps instead of
    2,500; a cell publishes the decay starts of the shorter budgets only, each seed has its own stable phase, and the
    longest budget is submitted first."""
    path = write_grid(tmp_path, base=WSD_BASE, share_stable_phase=True,
                      axes={"train.max_steps": [100, 200, 300, 400, 500, 1000], "seed": [0, 1]})
    grid = load_grid(path, cells=["max_steps=1000,*", "max_steps=300,seed=0"])  # a cell's phase whatever --cells says
    phases = {c.name: c.config.train.stable_phase for c in grid.cells}
    assert phases["max_steps=1000,seed=0"].publish == (80, 160, 240, 320, 400)
    assert phases["max_steps=300,seed=0"].publish == (80, 160)
    assert phases["max_steps=300,seed=0"].dir == str(tmp_path / "runs" / "g" / ".grid" / "stable" / "seed=0")
    assert phases["max_steps=1000,seed=1"].dir.endswith("seed=1")
    full = load_grid(path)
    rows = {r["name"]: r for r in plan_rows(full)}
    seed0 = [r for name, r in rows.items() if name.endswith("seed=0")]
    tokens_per_step = 8 * 128
    assert sum(r["tokens"] for r in seed0) == 2500 * tokens_per_step
    assert sum(r["tokens"] - r["tokens_saved"] for r in seed0) == 1300 * tokens_per_step
    assert rows["max_steps=1000,seed=0"]["tokens_saved"] == 0 and rows["max_steps=100,seed=0"]["branch_from_step"] == 80
    table = plan_table(full, list(rows.values()))
    assert "2 shared stable phases (share_stable_phase) train 2.66M tokens instead of 5.12M" in table
    assert [c.name for c in launch_order(grid.cells)][:2] == ["max_steps=1000,seed=0", "max_steps=1000,seed=1"]


def test_the_local_executor_starts_a_branch_once_its_stable_phase_has_published_its_start(tmp_path, monkeypatch):
    """Two cells at a time: the shorter budget waits while the longer one runs without having published its decay
    start (started at once, it would train from step 0), and starts when it has; a branch with a checkpoint of its
    own resumes from it, so it does not wait."""
    path = write_grid(tmp_path, base=WSD_BASE, share_stable_phase=True, axes={"train.max_steps": [100, 1000]})
    grid = load_grid(path)
    long, short = launch_order(grid.cells)
    assert not ready(short, [long]) and ready(short, []) and ready(long, [short])
    events = []

    class Cell:  # a cell's process: the long one publishes the short one's start at its 3rd poll, each ends at its 6th
        def __init__(self, cell):
            self.cell, self.polls, self.returncode = cell, 0, None

        def poll(self):
            self.polls += 1
            if self.cell is long and self.polls == 3:
                branch_point(short.config).parent.mkdir(parents=True, exist_ok=True)
                branch_point(short.config).touch()
                events.append("published")
            self.returncode = 0 if self.polls >= 6 else None
            return self.returncode

    monkeypatch.setattr(local, "_start", lambda grid, cell, threads: events.append(cell.name) or Cell(cell))
    monkeypatch.setattr(local, "_finish", lambda *_: 0)
    monkeypatch.setattr(local, "POLL_S", 0)
    assert local.run_local(grid, [long, short], 2, print) == 0
    assert events == [long.name, "published", short.name]
    branch_point(short.config).unlink()
    (short.run_dir / "checkpoints").mkdir(parents=True)
    (short.run_dir / "checkpoints" / "last.ckpt").touch()
    assert ready(short, [long])


def test_a_shared_stable_phase_needs_wsd(tmp_path):
    path = write_grid(tmp_path, share_stable_phase=True, axes={"train.max_steps": [100, 200]})
    with pytest.raises(ValueError, match="share_stable_phase needs train.schedule: wsd, but cell max_steps=100 has "
                                         "constant"):
        load_grid(path)
