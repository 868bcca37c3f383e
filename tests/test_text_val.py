"""val/text_loss: the validation loss over held-out natural text only (data.text_val_files), logged beside
val/loss (over data.files' held-out documents, which may be probe-format ones) and the synthetic losses;
the NoPE short-context cost test reads it (analysis/findings.py)."""

import math

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TINY, run_cli

TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
        "foolishness, it was the epoch of belief, it was the epoch of incredulity.\n")


def test_text_val_loss_is_logged_beside_val_loss(tmp_path):
    text = tmp_path / "dickens.txt"
    text.write_text(TEXT * 40)
    run_dir = tmp_path / "run"
    r = run_cli("train", "--run-dir", str(run_dir), *TINY, "--set", "train.max_steps=4",
                "--set", "train.warmup_steps=1", "--set", "train.val_every_n_steps=2", "--set", "train.val_batches=1",
                "--set", "eval.every_n_steps=0", "--set", "eval.at_end=false",
                "--set", "eval.heads.every_n_steps=0", "--set", "data.synthetic.fraction=0.2",
                "--set", f"data.text_val_files=[{text}]")
    assert r.returncode == 0, r.stderr[-3000:]
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    text_loss, val_loss = acc.Scalars("val/text_loss"), acc.Scalars("val/loss")
    assert [e.step for e in text_loss] == [e.step for e in val_loss] == [2, 4]
    assert all(math.isfinite(e.value) for e in text_loss) and text_loss[-1].value != val_loss[-1].value
    assert "val/synthetic_loss" in acc.Tags()["scalars"]


def test_text_val_files_too_short_is_an_error(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("Too short.")
    r = run_cli("train", "--run-dir", str(tmp_path / "run"), *TINY, "--set", "train.max_steps=2",
                "--set", "train.warmup_steps=1", "--set", f"data.text_val_files=[{text}]")
    assert r.returncode == 2 and "data.text_val_files" in r.stderr
