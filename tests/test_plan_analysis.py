"""Analysis reads the run plan, not how a config spelled the model: a grid whose SWA hybrids are written
``SSSF`` (``model.mixer`` naming another mixer, unused) is analysed exactly as the same grid written ``EEEF`` with
``model.mixer: swa``: the same labels, arms, tests and numbers, whether the plan was recorded (plan.json) or
rebuilt from an older run's config.yaml."""

import json

import pandas as pd
import yaml

from hybrid_lightning.analysis.findings import verdicts
from hybrid_lightning.analysis.load import find_runs, load_runs
from hybrid_lightning.config import validate_config
from hybrid_lightning.plan.resolve import make_plan, resolve_config
from hybrid_lightning.rundir.files import read_plan, write_plan
from test_findings import arm

RISE = {16: lambda s: (0.0, 0.6 + 0.02 * s, 0.8, 0.9), 64: lambda s: (0.0, 0.0, 0.1 + 0.05 * s, 0.7)}
HEADS = {16: lambda s: ((0, 0.0), (1, 0.3), (1, 0.4), (2, 0.5)),
         64: lambda s: ((0, 0.0), (0, 0.0), (0, 0.05), (1, 0.3))}


def grid(root, pattern: str, mixer: str, recorded: bool):
    """Two windows, RoPE and NoPE at the smaller one, 3 seeds each; the SWA layers written as ``pattern``."""
    for name, window, pos in (("w16", 16, "rope"), ("w64", 64, "rope"), ("w16-nope", 16, "nope")):
        arm(root, name, 3, window=window, pos_full=pos, score=RISE[window], heads=HEADS[window], pattern=pattern,
            beyond=lambda s, pos=pos: 0.3 if pos == "nope" else 0.0)
    for run in find_runs(root):
        path = run / "config.yaml"
        config = yaml.safe_load(path.read_text())
        config["model"]["mixer"] = mixer
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        if recorded:
            config.pop("provenance")
            write_plan(run, make_plan(resolve_config(validate_config(config))))
    return load_runs(find_runs(root), root=root)


def test_sssf_and_eeef_are_one_architecture_analysed_identically(tmp_path):
    written = grid(tmp_path / "sssf", "SSSF", "mamba2", recorded=True)
    spelled = grid(tmp_path / "eeef", "EEEF", "swa", recorded=False)
    assert not read_plan(tmp_path / "sssf" / "w16-s0").rebuilt and read_plan(tmp_path / "eeef" / "w16-s0").rebuilt
    a, b = written.configs.set_index("run"), spelled.configs.set_index("run")
    assert a["label"].equals(b["label"]) and a["arch"].map(json.loads).equals(b["arch"].map(json.loads))
    assert sorted(a["label"].unique()) == ["W=16 pos.full=nope", "W=16 pos.full=rope", "W=64 pos.full=rope"]
    assert a["windowed_hybrid"].all() and (a["full_layers"] == "3").all() and (a["mixers"] == "swa").all()
    tests_a, comparisons_a = verdicts(written)
    tests_b, comparisons_b = verdicts(spelled)
    pd.testing.assert_frame_equal(tests_a, tests_b)
    pd.testing.assert_frame_equal(comparisons_a, comparisons_b)
    tested = set(tests_a["test"])
    assert "laziness" in tested and any(t.startswith("beyond:") for t in tested)  # the windowed-hybrid tests saw them
    assert tests_a.set_index("test").loc["laziness", "verdict"] not in ("not tested", "no signal")
