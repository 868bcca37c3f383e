"""During and after a run: the last step logged and validated whatever the intervals, start and end
lines and text progress on the console, no third-party banners, gradient norm, throughput (tokens/s,
model TFLOP/s, MFU where the peak is known) and peak memory."""

import pytest

from conftest import TINY, run_cli
from hybrid_lightning.config import load_config
from hybrid_lightning.plan.precision import peak_bf16_tflops
from hybrid_lightning.rundir.events import read_events
from hybrid_lightning.rundir.files import read_plan
from hybrid_lightning.training.run import train

NO_EVAL = ["--set", "eval.every_n_steps=0", "--set", "eval.at_end=false", "--set", "eval.heads.every_n_steps=0",
           "--set", "eval.heads.at_end=false"]


def steps(run_dir) -> dict[str, list[int]]:
    acc = read_events(run_dir)
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_3_step_run_logs_and_validates_its_step_and_prints_no_banners(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli("train", "--run-dir", str(run_dir), *TINY, *NO_EVAL, "--set", "train.max_steps=3",
                "--set", "train.warmup_steps=0")
    assert r.returncode == 0, r.stderr[-3000:]
    logged = steps(run_dir)
    for tag in ("train/loss", "train/lr", "train/tokens", "train/grad_norm", "train/peak_memory_gib", "val/loss",
                "val/ppl",
                "train/tokens_per_sec", "train/tflops_per_sec"):
        assert logged[tag] == [3], tag  # a step is the optimizer steps completed
    assert "epoch" not in logged and "train/mfu" not in logged  # no MFU without a GPU of known peak
    acc = read_events(run_dir)
    tokens_per_sec, tflops = (acc.Scalars(t)[0].value for t in ("train/tokens_per_sec", "train/tflops_per_sec"))
    flops = read_plan(run_dir).flops_per_token
    assert tflops * 1e12 / tokens_per_sec == pytest.approx(flops, rel=1e-5)  # one device: its model FLOPs per second
    assert f"{run_dir}: " in r.stdout and "tokens in 3 steps, from step 0" in r.stdout
    assert "step 3/3  train/loss" in r.stdout  # the progress line of a run without a progress bar
    assert f"{run_dir}: done at step 3: train/loss" in r.stdout and "val/loss" in r.stdout
    # served from its parent, where the run is named after its folder, on the headline page showing it alone
    assert (f"tensorboard --logdir {tmp_path}  # then open http://localhost:6006/#custom_scalars&regexInput=%5Erun%24"
            in r.stdout)
    for banner in ("GPU available", "TPU available", "Trainer.fit", "weights_only"):
        assert banner not in r.stdout + r.stderr, banner


def test_the_mfu_peak_is_known_by_the_device_name():
    assert peak_bf16_tflops("NVIDIA H200") == peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0 and peak_bf16_tflops("Tesla T4") is None


@pytest.mark.slow
def test_a_40_step_run_validates_at_its_end_and_prints_progress(tmp_path, capsys):
    cfg = load_config(None, [*TINY[1::2], *NO_EVAL[1::2], "train.max_steps=40", "train.warmup_steps=2",
                                  "train.schedule=constant"])  # constant: the run may be extended
    run_dir = train(cfg, tmp_path / "run")
    logged = steps(run_dir)
    assert logged["train/loss"] == [10, 20, 30, 40] and logged["train/grad_norm"] == [10, 20, 30, 40]
    assert logged["val/loss"] == [40]  # val_every_n_steps is 100
    out = capsys.readouterr().out
    assert ([line.split()[1] for line in out.splitlines() if line.startswith("step ")]
            == ["10/40", "20/40", "30/40", "40/40"])
    train(load_config(None, [*TINY[1::2], *NO_EVAL[1::2], "train.max_steps=45", "train.warmup_steps=2",
                                "train.schedule=constant"]), run_dir)
    out = capsys.readouterr().out
    assert "tokens in 45 steps, resuming at step 40" in out and "done at step 45" in out
    assert steps(run_dir)["train/loss"] == [10, 20, 30, 40, 45]


def test_the_start_and_end_lines_print_beside_a_progress_bar(tmp_path, capsys):
    cfg = load_config(None, [*TINY[1::2], *NO_EVAL[1::2], "train.max_steps=2", "train.warmup_steps=0",
                             "train.progress_bar=true"])
    train(cfg, tmp_path / "run")
    lines = capsys.readouterr().out.replace("\r", "\n").splitlines()
    assert any(line.startswith(f"{tmp_path / 'run'}: ") and "tokens in 2 steps, from step 0, " in line
               for line in lines)
    assert any(line.startswith(f"{tmp_path / 'run'}: done at step 2: train/loss") for line in lines)
    assert not any(line.startswith("step 2/2") for line in lines)  # the bar shows the progress


def test_each_printed_value_is_its_steps_and_the_last_line_is_the_summarys(tmp_path):
    """Lightning moves a step's values into ``callback_metrics`` after the callbacks' batch end: a line printed then
    would show the step before's loss and a validation loss of steps ago. Lines wait for their step's values."""
    run_dir = tmp_path / "run"
    r = run_cli("train", "--run-dir", str(run_dir), *TINY, *NO_EVAL, "--set", "train.max_steps=6",
                "--set", "train.warmup_steps=0",
                "--set", "train.log_every_n_steps=2", "--set", "train.val_every_n_steps=4")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = {int(line.split()[1].split("/")[0]): line for line in r.stdout.splitlines() if line.startswith("step ")}
    assert sorted(lines) == [2, 4, 6]
    acc = read_events(run_dir)
    for step, line in lines.items():
        values = dict(zip(line.split()[2::2], map(float, line.split()[3::2])))
        loss = next(e.value for e in acc.Scalars("train/loss") if e.step == step)
        assert values["train/loss"] == pytest.approx(loss, rel=1e-3), (step, line)
        validated = [e.value for e in acc.Scalars("val/loss") if e.step == step]
        assert ("val/loss" in values) == bool(validated), line  # validation at 4 and the last step only
        if validated:
            assert values["val/loss"] == pytest.approx(validated[0], rel=1e-3)
    summary = next(line for line in r.stdout.splitlines() if line.startswith(f"{run_dir}: done at step 6: "))
    last = lines[6].split()
    assert f"train/loss {last[3]}  val/loss {last[5]}" in summary


def test_a_resumed_run_with_a_progress_bar_prints_none_of_lightnings_own_lines(tmp_path):
    common = [*TINY, *NO_EVAL, "--set", "train.warmup_steps=0", "--set", "train.schedule=constant",
              "--set", "train.progress_bar=true",
              "--set", "train.val_every_n_steps=2", "--set", "train.checkpoint_every_n_steps=2"]
    run_dir = tmp_path / "run"
    out = ""
    for steps in (2, 4):
        r = run_cli("train", "--run-dir", str(run_dir), *common, "--set", f"train.max_steps={steps}")
        assert r.returncode == 0, r.stderr[-3000:]
        out += r.stdout + r.stderr
    assert "resuming from last.ckpt at step 2" in out and "done at step 4" in out
    # Lightning's bars, banners and warnings that training/trainer.py filters by their text
    for fragment in ("Restoring states", "Restored all states", "Validation", "Epoch 0", "Training:", "DataLoader",
                     "GPU available", "TPU available", "HPU available", "💡", "Trainer.fit", "resumable",
                     "many workers", "LeafSpec", "Checkpoint directory"):
        assert fragment not in out, fragment
