"""Kimi Delta Attention and Gated DeltaProduct as values of a grid's mixer axis: a demo-sized grid planned (``grid
plan``: parameters, FLOPs, memory, GPU-hours), trained a few steps, and labelled by analysis from what each run
recorded (no name of either mixer in analysis/)."""

import pandas as pd
import pytest

from hybrid_lightning.analysis.report import analyze
from hybrid_lightning.cli import main
from hybrid_lightning.grid.report import plan_rows
from hybrid_lightning.grid.spec import load_grid
from hybrid_lightning.training.run import train
from test_grid import write_grid

BASE = {
    "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "pattern": "EF", "recurrent_chunk": 16,
              "gated_deltaproduct": {"householder": 2}},
    "train": {"max_steps": 3, "batch_size": 2, "seq_len": 48, "warmup_steps": 1, "progress_bar": False,
              "log_every_n_steps": 1, "checkpoint_every_n_steps": 3, "val_every_n_steps": 1000},
    "data": {"max_tokens": 200_000},
    "eval": {"every_n_steps": 0, "at_end": False, "heads": {"every_n_steps": 0, "at_end": False}},
}


def grid_of_both(folder):
    return load_grid(write_grid(folder, base=BASE, axes={"model.mixer": ["kda", "gated_deltaproduct"]}))


def test_a_grid_over_the_new_mixers_is_planned(tmp_path, capsys):
    grid = grid_of_both(tmp_path)
    assert main(["grid", "plan", str(tmp_path / "g.yaml")]) == 0
    assert "mixer=gated_deltaproduct" in capsys.readouterr().out
    rows = plan_rows(grid)
    assert len(rows) == 2 and all(r["peak_memory"] > 0 and r["gpu_hours"] > 0 for r in rows)
    for cell in grid.cells:
        assert [layer.mixer for layer in cell.plan.layers] == [cell.config.model.mixer, "full"]
        assert cell.plan.flops_per_token > 6 * cell.plan.params["non_embedding"]  # the operator's FLOPs counted


@pytest.mark.slow
def test_a_grid_over_the_new_mixers_trains_and_is_labelled(tmp_path):
    """Three steps each, in this process (about a minute of CPU)."""
    for cell in grid_of_both(tmp_path).cells:
        train(cell.config, cell.run_dir)
    out = tmp_path / "analysis"
    analyze(tmp_path / "runs" / "g", out)
    labels = sorted(pd.read_csv(out / "runs.csv")["label"])  # what differs between runs, values cut at 16 chars
    assert labels[0].startswith("gated_deltaprod") and labels[1] == "kda"
