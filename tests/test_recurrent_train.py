"""B3: EEEF hybrids with each recurrent mixer train through `hybrid-lightning train` on CPU."""

import pytest

from conftest import run_cli
from test_train import _final_weights, scalars

SMALL = [
    "--set", "model.n_layers=4", "--set", "model.d_model=64", "--set", "model.n_heads=2", "--set", "model.pattern=EEEF",
    "--set", "model.mamba2.d_state=32", "--set", "train.batch_size=8", "--set", "train.seq_len=64",
    "--set", "train.progress_bar=false", "--set", "data.max_tokens=2000000",
]
# Each mixer once with RoPE and once with NoPE on its full-attention layers: one of the two runs
# by default, the other (and the resume checks of two mixers) in the slow suite.
QUICK = [("mamba2", "rope"), ("gated_deltanet", "nope"), ("lightning", "rope")]
SLOW = [("mamba2", "nope"), ("gated_deltanet", "rope"), ("lightning", "nope"), ("kda", "rope"),
        ("gated_deltaproduct", "nope")]


def _train_falls(tmp_path, mixer, pos):
    run_dir = tmp_path / "run"
    r = run_cli("train", "--run-dir", str(run_dir), *SMALL, "--set", f"model.mixer={mixer}",
                "--set", f"model.pos.full={pos}", "--set", "train.max_steps=200",
                "--set", "train.val_every_n_steps=200")
    assert r.returncode == 0, r.stderr[-3000:]
    loss = scalars(run_dir, "train/loss")
    assert loss[-1][0] == 200
    assert loss[-1][1] < 0.7 * loss[0][1], loss
    assert scalars(run_dir, "val/loss")
    assert list((run_dir / "eval").glob("step_*.json"))  # long-context evaluation ran through the recurrent layers


@pytest.mark.parametrize("mixer, pos", QUICK)
@pytest.mark.slow
def test_recurrent_hybrid_loss_falls(tmp_path, mixer, pos):
    _train_falls(tmp_path, mixer, pos)


@pytest.mark.slow
@pytest.mark.parametrize("mixer, pos", SLOW)
def test_recurrent_hybrid_loss_falls_other_position_encoding(tmp_path, mixer, pos):
    _train_falls(tmp_path, mixer, pos)


def _resume_is_exact(tmp_path, mixer):
    """A run stopped at step 10 and trained on to 20 ends with the weights and losses of a straight run
    (constant schedule, so the shorter first leg sees the same learning rates)."""
    args = [*SMALL, "--set", f"model.mixer={mixer}", "--set", "train.schedule=constant",
            "--set", "train.warmup_steps=4", "--set", "train.log_every_n_steps=1",
            "--set", "train.checkpoint_every_n_steps=10", "--set", "train.val_every_n_steps=15"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    legs = [run_cli("train", "--run-dir", str(d), *args, "--set", f"train.max_steps={n}")
            for d, n in ((straight, 20), (resumed, 10), (resumed, 20))]
    assert all(r.returncode == 0 for r in legs), [r.stderr[-2000:] for r in legs]
    assert "resuming from" in legs[2].stdout, legs[2].stdout[-2000:]
    told = "\n".join(r.stdout[-1500:] for r in legs)  # the console of each leg, should a check fail
    # The losses first: where they part, the first differing step tells which part of a resume went wrong.
    a, b = scalars(straight, "train/loss"), scalars(resumed, "train/loss")
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, 21)), (a, b, told)
    assert a == b, (next(x for x in zip(a, b) if x[0] != x[1]), told)
    a, b = _final_weights(straight), _final_weights(resumed)
    assert a.keys() == b.keys()
    worst = max(((a[k] - b[k]).abs().max().item(), k) for k in a)
    assert worst[0] <= 1e-6, (worst, told)


@pytest.mark.slow
def test_resume_is_exact_gated_deltanet(tmp_path):
    _resume_is_exact(tmp_path, "gated_deltanet")


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["mamba2", "lightning"])
def test_resume_is_exact_other_mixers(tmp_path, mixer):
    _resume_is_exact(tmp_path, mixer)
