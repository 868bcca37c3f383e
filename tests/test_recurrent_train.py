"""B3: EEEF hybrids with each recurrent mixer train through `hybrid-lightning train` on CPU."""

import pytest

from test_train import _final_weights, scalars

from conftest import run_cli

SMALL = [
    "--set", "model.n_layers=4", "--set", "model.d_model=64", "--set", "model.n_heads=2", "--set", "model.pattern=EEEF",
    "--set", "model.mamba2.d_state=32", "--set", "train.batch_size=8", "--set", "train.seq_len=64",
    "--set", "train.progress_bar=false", "--set", "data.max_tokens=2000000",
]
# Each mixer once with RoPE and once with NoPE on its full-attention layers: one of the two runs
# by default, the other (and the resume checks of two mixers) in the slow suite.
QUICK = [("mamba2", "rope"), ("gated_deltanet", "nope"), ("lightning", "rope")]
SLOW = [("mamba2", "nope"), ("gated_deltanet", "rope"), ("lightning", "nope")]


def _train_falls(tmp_path, mixer, pos):
    run_dir = tmp_path / "run"
    r = run_cli("train", "--run-dir", str(run_dir), *SMALL, "--set", f"model.mixer={mixer}",
                "--set", f"model.pos.full={pos}", "--set", "train.max_steps=200", "--set", "train.val_every_n_steps=200")
    assert r.returncode == 0, r.stderr[-3000:]
    loss = scalars(run_dir, "train/loss")
    assert loss[-1][0] == 199
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
    args = [*SMALL, "--set", f"model.mixer={mixer}", "--set", "train.schedule=constant", "--set", "train.warmup_steps=4",
            "--set", "train.log_every_n_steps=1", "--set", "train.checkpoint_every_n_steps=10",
            "--set", "train.val_every_n_steps=15"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run_cli("train", "--run-dir", str(straight), *args, "--set", "train.max_steps=20").returncode == 0
    assert run_cli("train", "--run-dir", str(resumed), *args, "--set", "train.max_steps=10").returncode == 0
    r = run_cli("train", "--run-dir", str(resumed), *args, "--set", "train.max_steps=20")
    assert r.returncode == 0 and "resuming from" in r.stdout, r.stderr[-3000:]
    a, b = _final_weights(straight), _final_weights(resumed)
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    assert scalars(straight, "train/loss") == scalars(resumed, "train/loss")


@pytest.mark.slow
def test_resume_is_exact_gated_deltanet(tmp_path):
    _resume_is_exact(tmp_path, "gated_deltanet")


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["mamba2", "lightning"])
def test_resume_is_exact_other_mixers(tmp_path, mixer):
    _resume_is_exact(tmp_path, mixer)
