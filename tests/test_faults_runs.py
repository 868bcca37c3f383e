"""Faults of runs and grids that let a wrong run through or cost a trained one: an export onto its own
run, duplicate grid cells, quoted numbers, extended schedules, untruthful states and exit codes, and
user errors that were tracebacks."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from hybrid_lightning.grid import load_grid
from hybrid_lightning.rundir import LOCK_FILE, read_status

from conftest import TINY, run_cli
from test_faults import args, loss_steps, one_line_error, start, stored_step, train, wait_for_step


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 4-step run of the tiny model."""
    run = tmp_path_factory.mktemp("trained") / "run"
    r = train(run, *args(4, 2))
    assert r.returncode == 0, r.stderr[-3000:]
    return run


def test_export_never_replaces_what_it_reads(trained, tmp_path):
    before = sorted(p.relative_to(trained) for p in trained.rglob("*"))
    probes = tmp_path / "probes" / "p.jsonl"
    assert run_cli("probes", "passkey", "--out", str(probes), "--lengths", "300", "--samples", "1").returncode == 0
    for out, extra in ((trained, []), (trained.parent, []), (trained / "exported", []),
                       (trained / "checkpoints", []), (probes.parent, ["--probes", str(probes)])):
        line = one_line_error(run_cli("export", str(trained), "--out", str(out), "--force", *extra))
        assert "which the export reads" in line, line
    assert sorted(p.relative_to(trained) for p in trained.rglob("*")) == before and probes.is_file()
    assert stored_step(trained / "checkpoints" / "last.ckpt") == 4


def write_grid(tmp_path, axes: str) -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(f"base:\n  model: {{n_layers: 2, d_model: 64, n_heads: 2, pattern: EF}}\naxes:\n{axes}")
    return path


def test_grid_cells_are_normalised_and_duplicates_refused(tmp_path):
    grid = load_grid(write_grid(tmp_path, "  model.window: [16, 32.0]\n  train.lr: [3e-4, 1.0e-3]\n"))
    assert [c.name for c in grid.cells] == ["window=16,lr=0.0003", "window=16,lr=0.001", "window=32,lr=0.0003",
                                            "window=32,lr=0.001"]
    assert grid.cells[2].labels["model.window"] == 32 and isinstance(grid.cells[2].labels["model.window"], int)
    line = one_line_error(run_cli("grid", "plan", str(write_grid(tmp_path, "  model.window: [16, 16.0]\n"))))
    assert "{'model.window': 16}" in line and "{'model.window': 16.0}" in line and "one run" in line, line
    presets = "  arch:\n    a: {model.window: 16}\n    b: {model.window: 16.0}\n"
    assert "one run" in one_line_error(run_cli("grid", "plan", str(write_grid(tmp_path, presets))))


@pytest.mark.parametrize("axis", ['model.window: ["32"]', 'train.lr: ["3e-4"]', 'eval.lengths: [["512"]]',
                                  'train.batch_size: [8, "8"]', 'seed: ["0"]'])
def test_grid_numbers_are_strict(tmp_path, axis):
    line = one_line_error(run_cli("grid", "plan", str(write_grid(tmp_path, f"  {axis}\n"))))
    assert "not the string" in line and axis.split(":")[0].split(".")[-1] in line, line


def test_grid_plan_of_a_huge_model_does_not_hang(tmp_path):
    t0 = time.perf_counter()
    r = run_cli("grid", "plan", str(write_grid(tmp_path, "  model.n_layers: [100000]\n  model.pattern: [F]\n")),
                timeout=120)
    assert time.perf_counter() - t0 < 60, "grid plan took a minute"
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr, r.stderr[-3000:]


def test_counts_from_layer_samples_equal_the_whole_model():
    from hybrid_lightning.config import validate_config
    from hybrid_lightning.grid.report import _model_counts
    from hybrid_lightning.model import build_model, count_params, model_flops_per_token, resolve_model_config

    for model in ({"pattern": "SGMLF", "n_layers": 10, "match_params": "F"}, {"pattern": "EF", "tie_embeddings": True}):
        cfg = resolve_model_config(validate_config({"model": model}).model)
        with torch.device("meta"):
            whole = build_model(cfg)
        assert _model_counts(cfg, 256) == (count_params(whole)["non_embedding"], model_flops_per_token(whole, 256))
