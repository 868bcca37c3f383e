"""C3 and C4: a tiny CPU run logs the long-context scalars and heatmap to TensorBoard and writes
eval/step_<k>.json; resuming continues the series with no duplicates and no gaps; the eval
command gives the callback's numbers on the same checkpoint."""

import io
import json

import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TINY, run_cli
from hybrid_lightning.records import pool

EVAL = ["--set", "eval.every_n_steps=10", "--set", "eval.tasks=[passkey,niah_single_2]", "--set", "eval.lengths=[512]",
        "--set", "eval.depths=[0.0,1.0]", "--set", "eval.position_sequences=1", "--set", "eval.position_length=400",
        "--set", "eval.longppl_context=64", "--set", "train.checkpoint_every_n_steps=20",
        "--set", "eval.generate_every_n_steps=20"]


def events(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def json_steps(run_dir):
    return sorted(int(p.stem.removeprefix("step_")) for p in (run_dir / "eval").glob("step_*.json"))


def train(run_dir, max_steps):
    r = run_cli("train", "--run-dir", str(run_dir), *TINY, *EVAL, "--set", f"train.max_steps={max_steps}",
                "--set", "train.schedule=constant")  # extended below: a schedule that allows it
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.slow
def test_callback_logs_resumes_and_matches_the_eval_command(tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, 35)  # evaluations after steps 10, 20, 30 and at the end (35)
    steps = [10, 20, 30, 35]  # the optimizer steps completed, as TensorBoard shows train/loss and the console counts
    first = _check_the_callback(run_dir, steps)

    # a crash after the evaluation at step 30 but before any later checkpoint: resume from step 20
    (run_dir / "checkpoints" / "last.ckpt").unlink()
    (run_dir / "checkpoints" / "step_0000035.ckpt").unlink()  # the last step's
    assert "resuming from step_0000020.ckpt at step 20" in train(run_dir, 35).stdout
    acc = events(run_dir)
    assert [e.step for e in acc.Scalars("val_longctx/score_beyond")] == steps  # no duplicates
    assert [e.step for e in acc.Images("val_longctx/heatmap")] == steps
    again = json.loads((run_dir / "eval" / "step_30.json").read_text())
    assert again["records"] == first["records"]  # the exact resume re-evaluates the same weights

    # training further continues the series
    train(run_dir, 45)
    steps += [40, 45]
    assert [e.step for e in events(run_dir).Scalars("val_longctx/score_beyond")] == steps
    assert json_steps(run_dir) == steps

    _check_the_eval_command(run_dir)


def _check_the_callback(run_dir, steps: list[int]) -> dict:
    """The first training's TensorBoard series, heatmaps and evaluation files; returns the record of step 30."""
    acc = events(run_dir)
    for tag in ("val_longctx/match_all", "val_longctx_tasks/passkey/match_all",
                "val_longctx_tasks/niah_single_2/match_part"):
        assert [e.step for e in acc.Scalars(tag)] == [20, 35], tag  # generation at multiples of 20 steps and at the end
    for tag in ("val_longctx_tasks/passkey/len_512", "val_longctx_tasks/niah_single_2/len_512",
                "val_longctx/score_beyond", "val_longctx/exact", "val_longctx_tasks/passkey/exact",
                "val_longctx_tasks/passkey/token_accuracy_out_window",
                "val_longctx_tasks/passkey/answer_loss_out_window",
                "val_longctx_tasks/passkey/chance_loss", "val_longctx_tasks/position_loss/000256-000400",
                "val_longctx/ppl_long"):
        assert [e.step for e in acc.Scalars(tag)] == steps, tag
    images = acc.Images("val_longctx/heatmap")
    assert [e.step for e in images] == steps
    png = Image.open(io.BytesIO(images[-1].encoded_image_string))
    assert png.size[0] > 200 and png.size[1] > 100
    assert json_steps(run_dir) == steps
    first = json.loads((run_dir / "eval" / "step_30.json").read_text())
    assert first["tokens"] == 30 * 8 * 128 and first["window"] == 32
    rec = first["records"][0]
    assert {"step", "tokens", "task", "length", "depth", "in_window", "n", "accuracy", "token_accuracy",
            "answer_loss", "chance_token_accuracy", "chance_loss", "answer_tokens", "distance", "generated",
            "generated_exact", "match_all", "match_part"} <= rec.keys()
    # the headline is the graded score, exact match and the generation score beside it; the probes' 512
    # tokens are beyond train.seq_len 128, so the score within the training length has nothing to average
    graded = [pool(first["records"], task=t, length=512) for t in ("passkey", "niah_single_2")]
    assert first["seq_len"] == 128 and first["score"] is None and "val_longctx/score" not in acc.Tags()["scalars"]
    assert first["score_beyond"] == pytest.approx(
        sum(p["token_accuracy"] - p["chance_token_accuracy"] for p in graded) / 2)
    assert first["exact"] == pytest.approx(sum(p["accuracy"] for p in graded) / 2)
    assert first["match_all"] is None and rec["generated"] == 0 and rec["match_all"] is None  # no generation at step 30
    generated = json.loads((run_dir / "eval" / "step_20.json").read_text())
    assert 0 <= generated["match_all"] <= 1 and all(r["generated"] == r["n"] for r in generated["records"])
    assert acc.Scalars("val_longctx/score_beyond")[2].value == pytest.approx(first["score_beyond"])
    assert {(r["task"], r["depth"]) for r in first["records"]} == {
        (t, d) for t in ("passkey", "niah_single_2") for d in (0.0, 1.0)}
    return first


def _check_the_eval_command(run_dir) -> None:
    """The eval command on the final checkpoint (step 45): the callback's numbers, printed and written again;
    another length added offline; LongPPL without and with an evaluator."""
    callback = json.loads((run_dir / "eval" / "step_45.json").read_text())
    r = run_cli("eval", str(run_dir))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "passkey" in r.stdout and "LongPPL" in r.stdout and "step_45.json" in r.stdout
    offline = json.loads((run_dir / "eval" / "step_45.json").read_text())
    assert offline == callback

    # another length, offline: added to the step's file, the callback's rows kept
    r = run_cli("eval", str(run_dir), "--lengths", "700", "--tasks", "passkey", "--set", "eval.position_sequences=0")
    assert r.returncode == 0, r.stderr[-3000:]
    merged = json.loads((run_dir / "eval" / "step_45.json").read_text())
    assert {(x["task"], x["length"]) for x in merged["records"]} == {
        ("passkey", 512), ("niah_single_2", 512), ("passkey", 700)}
    assert [x for x in merged["records"] if x["length"] == 512] == callback["records"]

    # LongPPL: not reported without an evaluator; with the finished run as its own evaluator, its key tokens
    assert callback["longppl"][0]["longppl"] is None and "eval.longppl_evaluator" in callback["longppl"][0]["reason"]
    r = run_cli("eval", str(run_dir), "--set", f"eval.longppl_evaluator={run_dir}")
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads((run_dir / "eval" / "step_45.json").read_text())["longppl"]
    assert row["evaluator"] == str(run_dir / "checkpoints" / "last.ckpt") and row["key_tokens"] is not None
    assert row["scored_tokens"] == callback["longppl"][0]["scored_tokens"]
    assert row["ppl"] == callback["longppl"][0]["ppl"]
    r = run_cli("eval", str(run_dir), "--set", f"eval.longppl_evaluator={run_dir / 'nowhere'}")
    assert r.returncode == 2 and "eval.longppl_evaluator: " in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_eval_command_user_errors(tmp_path):
    r = run_cli("eval", str(tmp_path))
    assert r.returncode == 2 and "no config.yaml" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("train", "--run-dir", str(tmp_path / "x"), *TINY, "--set", "eval.tasks=[needle]")
    assert r.returncode == 2 and "eval.tasks" in r.stderr and "niah_single_1" in r.stderr
    r = run_cli("train", "--run-dir", str(tmp_path / "y"), *TINY, "--set", "eval.lengths=[100]",
                "--set", "train.max_steps=2", "--set", "train.warmup_steps=1")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "eval.lengths: 100 tokens is too short for task 'passkey'" in r.stderr, r.stderr[-2000:]
