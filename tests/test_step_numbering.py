"""One step numbering: a step is the optimizer steps completed, the same on the console, in checkpoint and
evaluation file names, in their records, in TensorBoard, in ``grid status`` and in analysis. Runs written before
(plan version 1, or no plan.json) numbered evaluations and scalars by the index of the step's last batch: they are
read with that numbering (``RunPlan.step_offset``), and not resumed."""

import json
import re

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import REPO, TINY, run_cli
from hybrid_lightning.analysis.load import load_runs
from hybrid_lightning.config import load_config
from hybrid_lightning.plan.resolve import plan_run
from hybrid_lightning.rundir import find_runs
from hybrid_lightning.rundir.files import read_plan, write_plan
from hybrid_lightning.rundir.legacy import plan_of_record
from hybrid_lightning.runplan import PLAN_VERSION, STEPS_COMPLETED, STEPS_INDEXED
from hybrid_lightning.training.resume import Resume, check_numbering

EVALUATIONS = ["--set", "eval.every_n_steps=4", "--set", "eval.tasks=[passkey]", "--set", "eval.lengths=[256]",
               "--set", "eval.depths=[0.5]", "--set", "eval.position_sequences=0",
               "--set", "eval.heads.every_n_steps=4",
               "--set", "eval.heads.tasks=[passkey]", "--set", "eval.heads.lengths=[512]",
               "--set", "eval.heads.depths=[0.5]",
               "--set", "train.max_steps=6", "--set", "train.warmup_steps=1", "--set", "train.log_every_n_steps=2",
               "--set", "train.checkpoint_every_n_steps=4", "--set", "train.val_every_n_steps=4"]


@pytest.mark.slow  # about 30 s on 2 shared cores: a 6-step run with both evaluations twice
def test_console_files_tensorboard_status_and_analysis_count_the_same_steps(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli("train", "--run-dir", str(run_dir), *TINY, *EVALUATIONS)
    assert r.returncode == 0, r.stderr[-3000:]
    console = sorted({int(s) for s in re.findall(r"^step (\d+): val_longctx evaluation\.\.\.$", r.stdout, re.M)})
    progress = [int(s) for s in re.findall(r"^step (\d+)/6 ", r.stdout, re.M)]
    assert console == [4, 6] and progress == [2, 4, 6] and "done at step 6" in r.stdout
    assert (sorted(p.name for p in (run_dir / "checkpoints").glob("step_*.ckpt"))
            == ["step_0000004.ckpt", "step_0000006.ckpt"])
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == ["heads_step_4.json", "heads_step_6.json",
                                                                    "step_4.json", "step_6.json"]
    for name in ("step_4.json", "heads_step_4.json"):
        record = json.loads((run_dir / "eval" / name).read_text())
        assert record["step"] == 4 and record["tokens"] == 4 * 8 * 128
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    steps = {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert steps["train/loss"] == [2, 4, 6] and steps["val/loss"] == [4, 6]
    assert steps["val_longctx/score_beyond"] == steps["val_longctx_heads/retrieval_heads"] == [4, 6]
    assert [e.step for e in acc.Images("val_longctx/heatmap")] == [4, 6]
    tokens = dict(zip(steps["train/tokens"], (e.value for e in acc.Scalars("train/tokens"))))
    assert tokens == {2: 2 * 1024, 4: 4 * 1024, 6: 6 * 1024}  # the tokens after the step that carries them
    plan = read_plan(run_dir)
    assert plan.version == PLAN_VERSION and plan.step_numbering == STEPS_COMPLETED and plan.step_offset == 0
    metrics = load_runs([run_dir]).metrics
    loss = metrics[metrics["metric"] == "train/loss"]
    assert loss["step"].tolist() == [2, 4, 6] and loss["tokens"].tolist() == [2048.0, 4096.0, 6144.0]
    r = run_cli("eval", str(run_dir), "--ckpt", str(run_dir / "checkpoints" / "step_0000004.ckpt"))
    assert r.returncode == 0 and "written to " + str(run_dir / "eval" / "step_4.json") in r.stdout, r.stderr[-2000:]


def test_older_plans_number_steps_by_index(tmp_path):
    _, plan = plan_run(load_config(None, TINY[1::2]))
    assert plan.step_numbering == STEPS_COMPLETED and plan.tokens_at_recorded(10) == 10 * 8 * 128
    version_1 = {k: v for k, v in plan.as_dict().items() if k != "step_numbering"} | {"version": 1}
    older = plan_of_record(version_1, "plan.json")
    assert older.step_numbering == STEPS_INDEXED and older.tokens_at_recorded(9) == 10 * 8 * 128
    # a run written before plan.json (a config.yaml alone): rebuilt, by index, its tokens as analysis always read them
    run = tmp_path / "run"
    run.mkdir()
    config = yaml.safe_load((find_runs(REPO / "analysis" / "results" / "cpu_replica" / "runs")[0] / "config.yaml")
                            .read_text())
    del config["provenance"]["data"]  # recorded since shortly before plan.json: without it, a run of before
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    rebuilt = read_plan(run)
    assert rebuilt.rebuilt and rebuilt.step_offset == 1


def test_a_run_recorded_by_index_is_not_resumed(tmp_path):
    _, plan = plan_run(load_config(None, TINY[1::2]))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    data = {k: v for k, v in plan.as_dict().items() if k != "step_numbering"} | {"version": 1}
    (run_dir / "plan.json").write_text(json.dumps(data))
    resume = Resume(run_dir / "checkpoints" / "last.ckpt", 20, None, None)
    with pytest.raises(ValueError, match="trained by an older hybrid-lightning, whose records number a step "
                                         "by the index "
                                         r"of its last batch \(plan version 1\); finish it with that version"):
        check_numbering(run_dir, resume)
    check_numbering(run_dir, None)  # nothing to resume: a new run
    write_plan(run_dir, plan)
    check_numbering(run_dir, resume)
