"""The diagnostics' commands end to end on a tiny trained Lightning hybrid: ``restrict``, ``probe-layers`` and
``gradient`` print their tables and write their records, a second restriction joins the first, and analysis reads
the run as before."""

import json

import pytest

from conftest import TINY
from hybrid_lightning.analysis.load import damaged_records, read_evals
from hybrid_lightning.cli import main

QUIET = ["--set", "model.mixer=lightning", "--set", "train.max_steps=2", "--set", "train.warmup_steps=1",
         "--set", "eval.every_n_steps=0", "--set", "eval.at_end=false", "--set", "eval.heads.every_n_steps=0",
         "--set", "eval.heads.at_end=false"]


@pytest.mark.slow
def test_the_diagnostics_commands_write_their_records(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--run-dir", str(run), *TINY, *QUIET]) == 0
    small = ["--set", "eval.tasks=[passkey]", "--set", "eval.lengths=[256]", "--set", "eval.depths=[0.5]",
             "--set", "eval.position_sequences=1"]
    assert main(["restrict", str(run), "--limit", "full:16", *small]) == 0
    assert main(["restrict", str(run), "--limit", "efficient:16", *small]) == 0  # joins the first's rows
    assert main(["probe-layers", str(run), "--samples", "20", "--length", "800", "--write-data",
                 str(tmp_path / "probes.json")]) == 0
    assert main(["gradient", str(run), "--samples", "2", "--context", "64", "--limit", "full:8"]) == 0
    out = capsys.readouterr().out
    assert "efficient" in out and "0 lightning" in out and "1 full" in out and "full:8" in out
    restricted = json.loads((run / "eval" / "restricted_step_2.json").read_text())["restricted"]
    assert [(r["layers"], r["receptive_field"]) for r in restricted] == [("full", 16), (None, None), ("efficient", 16)]
    probes = json.loads((run / "eval" / "layer_probe_step_2.json").read_text())["layer_probe"]
    assert [(r["layer"], r["mixer"], r["feature"]) for r in probes][:3] == [
        (0, "lightning", "residual"), (0, "lightning", "delta"), (1, "full", "residual")]
    assert len(json.loads((tmp_path / "probes.json").read_text())) == 20
    gradient = json.loads((run / "eval" / "gradient_step_2.json").read_text())["gradient"]
    assert len(gradient) == 2 * 64 and gradient[0]["sample_count"] == 2
    assert damaged_records(run) == [] and read_evals(run)[0] == []
    assert main(["gradient", str(run), "--limit", "middle:8"]) == 2
    assert json.loads((run / "eval" / "layer_probe_step_2.json").read_text())["template"] == "authors"
    assert main(["probe-layers", str(run), "--samples", "20", "--length", "512", "--brief"]) == 0
    record = json.loads((run / "eval" / "layer_probe_step_2.json").read_text())
    assert record["template"] == "brief" and record["prompt_tokens"] <= 512
    assert "--limit 'middle:8'" in capsys.readouterr().err
