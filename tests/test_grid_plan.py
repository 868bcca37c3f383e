"""``grid plan`` and ``grid submit`` of a grid narrowed and changed from the command line (``--cells``, ``--set``), the
GPU-hours of a stated GPU and the cells whose memory does not fit it, with a setting that does."""

import json

import pytest
import yaml

from conftest import REPO
from hybrid_lightning.cli import main
from hybrid_lightning.config import validate_config
from hybrid_lightning.grid.capacity import DEFAULT_GPU, plan_gpu, profile_gpu
from hybrid_lightning.grid.report import plan_rows, plan_table
from hybrid_lightning.grid.spec import load_grid
from hybrid_lightning.plan.memory import fitting_setting
from hybrid_lightning.plan.resolve import plan_run
from hybrid_lightning.units import figure
from test_grid import TINY_BASE, write_grid


def test_set_applies_to_every_cell_and_cells_picks_them(tmp_path):
    path = write_grid(tmp_path, axes={"model.window": [8, 16], "seed": [0, 1]})
    grid = load_grid(path, overrides=["train.max_steps=7", "train.lr=0.01"], cells=["window=16,*", "*,seed=0"])
    assert [c.name for c in grid.cells] == ["window=8,seed=0", "window=16,seed=0", "window=16,seed=1"]
    assert {(c.config.train.max_steps, c.config.train.lr) for c in grid.cells} == {(7, 0.01)}
    assert all(c.plan.budget.max_steps == 7 for c in grid.cells)
    assert load_grid(path, resolve=False, cells=["window=8,seed=1"]).cells[0].plan is None


@pytest.mark.parametrize("overrides, cells, message", [
    (["model.window=4"], [], "--set model.window=4 makes cells window=8,seed=0 and window=16,seed=0 one run; "
                             "pick one with --cells"),
    (["name=x"], [], "--set name: each cell is named after its values"),
    (["train.max_step=7"], [], r"--set: .*train.max_step"),
    ([], ["window=32,*"], r"--cells 'window=32,\*' matches no cell; did you mean 'window=8,seed=0'"),
])
def test_bad_selections_name_the_option(tmp_path, overrides, cells, message):
    path = write_grid(tmp_path, axes={"model.window": [8, 16], "seed": [0]})
    with pytest.raises(ValueError, match=message):
        load_grid(path, overrides=overrides, cells=cells)
    if overrides == ["model.window=4"]:  # over an axis, for one cell: a smoke run of it
        assert load_grid(path, overrides=overrides, cells=["window=16,*"]).cells[0].config.model.window == 4


def test_a_smoke_run_of_one_cell_of_a_real_grid_previews_with_the_command_line(tmp_path, capsys):
    cell = "arch=full,size=S1,tokens_per_param=100.0,seed=0"
    assert main(["grid", "submit", str(REPO / "ablations" / "paper.yaml"), "--root", str(tmp_path), "--cells", cell,
                 "--set", "train.max_steps=5", "--set", "train.tokens_per_param=null", "--set", "train.warmup_steps=1",
                 "--print-config"]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert len(documents) == 1 and documents[0]["name"] == cell and documents[0]["train"]["max_steps"] == 5


def test_the_fitting_setting_keeps_the_tokens_of_a_step():
    _, plan = plan_run(validate_config({**TINY_BASE, "train": {**TINY_BASE["train"], "batch_size": 8}}))
    estimate = plan.memory_estimate
    assert fitting_setting(plan, estimate.peak()) == {}
    between = (estimate.peak() + estimate.peak(True)) // 2
    assert fitting_setting(plan, between) == {"train.activation_checkpointing": True}
    setting = fitting_setting(plan, estimate.peak(True) - 1)
    batch, accumulate = setting["train.batch_size"], setting["train.accumulate_grad_batches"]
    assert batch < 8 and batch * accumulate == 8  # the same sequences per step
    smaller = validate_config({**TINY_BASE, "model": {**TINY_BASE["model"], "vocab_size": 257},
                               "train": {**TINY_BASE["train"], "batch_size": batch,
                                         "accumulate_grad_batches": accumulate}})
    at = plan_run(smaller)[1].memory_estimate
    assert at.peak(setting.get("train.activation_checkpointing", False)) <= estimate.peak(True) - 1
    assert fitting_setting(plan, estimate.weights) is None  # not even the weights fit


def test_grid_plan_states_the_gpu_its_hours_and_the_cells_that_do_not_fit(tmp_path, capsys):
    path = write_grid(tmp_path, axes={"model.window": [8, 16]})
    rows = plan_rows(load_grid(path))
    peak = rows[0]["peak_memory"]
    profile = tmp_path / "cluster.yaml"
    profile.write_text(yaml.safe_dump({"gpu": {"name": "Tiny GPU", "memory_gib": (peak - 1) / 2**30, "tflops": 1e-9},
                                       "timeout_min": 10}))
    assert main(["grid", "plan", str(path), "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    gpu = profile_gpu(profile)
    hours = sum(c.plan.budget.tokens / gpu.tokens_per_s(c.plan.flops_per_token) / 3600 for c in load_grid(path).cells)
    assert f"GPU-h: {figure(hours)} GPU-hours in all at 1e-09 TFLOP/s per GPU (Tiny GPU, profile {profile};" in out
    assert "--set train.activation_checkpointing=true" in out and "2 of 2 cells exceed the GPU's memory" in out
    assert main(["grid", "plan", str(path), "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert all(r["fits"] and r["fitting_setting"] is None and r["gpu_hours"] > 0 for r in default)  # an H100 holds them
    assert (plan_gpu(None, None, 1000.0).tokens_per_s(1.0) == 1000.0
            == plan_gpu(str(profile), None, 1000.0).tokens_per_s(5.0))
    assert "GPU-h" not in plan_table(load_grid(path, overrides=["train.accelerator=cpu"]),
                                     plan_rows(load_grid(path, overrides=["train.accelerator=cpu"])), DEFAULT_GPU)


def test_a_profile_without_a_gpu_gives_the_default_and_a_bad_one_is_named(tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text("timeout_min: 10\n")  # a profile that says only where cells run (as grid plan checks it)
    gpu = profile_gpu(profile)
    assert (gpu.name, gpu.memory_gib, gpu.tflops) == (DEFAULT_GPU.name, DEFAULT_GPU.memory_gib, DEFAULT_GPU.tflops)
    assert f"profile {profile} has no 'gpu:' section" in gpu.source
    profile.write_text("gpu: 80\n")
    with pytest.raises(ValueError, match="'gpu:' must be a section"):
        profile_gpu(profile)
    profile.write_text("gpu: {name: X, memory_gib: 80, tflops: -1}\n")
    with pytest.raises(ValueError, match="gpu.tflops must be a positive number"):
        profile_gpu(profile)
    profile.write_text("gpu: {name: X, memory_gib: 80, tflops: 300, peak: 1}\n")
    with pytest.raises(ValueError, match="gpu.peak is not a key"):
        profile_gpu(profile)


def test_figures_have_three_digits_and_no_exponent():
    assert ([figure(x) for x in (1234.5, 1030.0, 12.34, 0.01234, 1.23e-5)]
            == ["1,230", "1,030", "12.3", "0.0123", "0.0000123"])
