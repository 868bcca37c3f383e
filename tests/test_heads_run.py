"""D2 end to end: a tiny CPU run logs retrieval-head scalars and the layer x head image to TensorBoard
and writes eval/heads_step_<k>.json; ``hybrid-lightning heads`` gives the callback's scores on the same
checkpoint, prints them and the accuracy drop of a head ablation, and reports user errors plainly."""

import io
import json

from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TINY, run_cli
from hybrid_lightning.cli import main

HEADS = ["--set", "eval.every_n_steps=0", "--set", "eval.at_end=false", "--set", "eval.tasks=[passkey]",
         "--set", "eval.lengths=[512]", "--set", "eval.depths=[0.0,1.0]",
         "--set", "eval.heads.every_n_steps=10", "--set", "eval.heads.tasks=[passkey,niah_single_2]",
         "--set", "eval.heads.lengths=[560]", "--set", "eval.heads.depths=[0.0,1.0]",
         "--set", "train.checkpoint_every_n_steps=10", "--set", "train.max_steps=15", "--set", "train.warmup_steps=5"]
SCORES = ("samples", "kept", "accuracy", "token_accuracy", "heads", "layers", "total", "settings")


def read(path):
    return json.loads(path.read_text())


def test_callback_logs_scores_and_the_command_gives_them_again(tmp_path, capsys):
    run_dir = tmp_path / "run"
    r = run_cli("train", "--run-dir", str(run_dir), *TINY, *HEADS)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [10, 15]  # after steps 10 and 15 (the end): the optimizer steps completed
    _check_tensorboard(run_dir, steps)
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == ["heads_step_10.json", "heads_step_15.json"]
    callback = read(run_dir / "eval" / "heads_step_15.json")
    # samples: 4 + 2 echoes
    assert callback["tokens"] == 15 * 8 * 128 and callback["samples"] == 6 and callback["ablation"] == []
    assert [(h["layer"], h["head"], h["mixer"]) for h in callback["heads"]] == [
        (0, 0, "swa"), (0, 1, "swa"), (1, 0, "full"), (1, 1, "full")]
    assert callback["settings"]["value_tokens"] == 16 and callback["layers"][1]["window"] is None

    # the command on the newest checkpoint: the callback's scores, printed and written with the ablation,
    # its heads chosen on held-out probes (seed 1). K is every attention head: a top K that ties at this early
    # step would be refused (test_heads). The top K then fills every layer: no layer-matched control exists,
    # and none is drawn
    assert main(["heads", str(run_dir), "--mask-top", "4", "--controls", "3", "--mask-each"]) == 0
    out = capsys.readouterr().out
    offline = read(run_dir / "eval" / "heads_step_15.json")
    assert {k: offline[k] for k in SCORES} == {k: callback[k] for k in SCORES}
    assert "retrieval score by layer and head" in out and "ablation: mask top-4 heads by score" in out and "drop" in out
    assert "random draws from the same layers" not in out
    assert "single-head ablation, token accuracy drop: 0.0" in out
    (row,) = [r for r in offline["ablation"] if r["selection"] == "top"]
    assert row["task"] == "passkey" and row["length"] == 512 and row["n"] == 2
    assert offline["selection"]["seed"] == 1
    assert sorted(map(tuple, row["masked"])) == sorted((h["layer"], h["head"]) for h in offline["selection"]["heads"])
    # where all K heads are not retrieval heads, draws of K of them from any layer: the top K itself, each
    # exactly as harmful, p = 1
    tests = offline["ablation_tests"]
    assert [t["match"] for t in tests] == ["non-retrieval"][: len(tests)]
    for test in tests:
        assert test["masked"] == row["masked"] and test["draw_harms"] == [test["harm"]] * 3 and test["p"] == 1.0
    assert not [r for r in offline["ablation"] if r["selection"] == "control"]
    nonretrieval = ["control_nonretrieval"] * 3 * len(tests)
    assert [r["selection"] for r in offline["ablation"] if r["selection"].startswith("control")] == nonretrieval
    assert len([r for r in offline["ablation"] if r["selection"] == "single"]) == 4

    # an older checkpoint gives that step's record; a random ablation is added beside the top one
    callback_10 = read(run_dir / "eval" / "heads_step_10.json")
    assert main(["heads", str(run_dir), "--ckpt", str(run_dir / "checkpoints" / "step_0000010.ckpt")]) == 0
    assert read(run_dir / "eval" / "heads_step_10.json") == callback_10
    assert "step 10 " in capsys.readouterr().out
    assert main(["heads", str(run_dir), "--mask-random", "1", "--seed", "3"]) == 0
    after = read(run_dir / "eval" / "heads_step_15.json")
    assert [r["selection"] for r in after["ablation"]] == ["top"] + nonretrieval + ["single"] * 4 + ["random"]
    assert after["ablation_tests"] == offline["ablation_tests"]

    # user errors: exit code 2, a message naming the bad option, no traceback
    assert main(["heads", str(run_dir), "--mask", "5.0"]) == 2
    assert ("--mask: ['5.0'] is not a list of attention heads (attention layers [0, 1], 2 heads each)"
            in capsys.readouterr().err)
    assert main(["heads", str(run_dir), "--set", "model.window=8"]) == 2
    assert "overrides may only change eval.* keys" in capsys.readouterr().err
    assert main(["heads", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err


def _check_tensorboard(run_dir, steps: list[int]) -> None:
    """The callback's scalars, per-layer cards and layer x head image in TensorBoard."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    for tag in ("val_longctx_heads/retrieval_heads", "val_longctx_heads/copy_heads", "val_longctx_heads/max_score",
                "val_longctx_heads/mean_score", "val_longctx_heads/seconds", "val_longctx_heads/probe_token_accuracy"):
        assert [e.step for e in acc.Scalars(tag)] == steps, tag
    # a layer's cards from the first scoring at which one of its heads scored above 0, none for the others
    scored = [{f"layer_{r['layer']:02d}" for r in read(run_dir / "eval" / f"heads_step_{s}.json")["layers"]
               if (r["max_score"] or 0) > 0} for s in steps]
    cards = {t.split("/")[1] for t in acc.Tags()["scalars"] if t.startswith("val_longctx_heads/layer_")}
    assert cards == scored[0] | scored[1]
    for layer in scored[0] | scored[1]:
        first = steps[0] if layer in scored[0] else steps[1]
        assert [e.step for e in acc.Scalars(f"val_longctx_heads/{layer}/max_score")] == [s for s in steps if s >= first]
    assert "val_longctx/score" not in acc.Tags()["scalars"]
    images = acc.Images("val_longctx_heads/scores")
    assert [e.step for e in images] == steps
    assert Image.open(io.BytesIO(images[-1].encoded_image_string)).size[0] > 200
