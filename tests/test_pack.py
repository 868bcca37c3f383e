"""analysis/pack.py: packed runs read as the runs they came from, analyze from them alone, a grid root
restored from them, and nothing pack did not write replaced."""

import shutil

import pandas as pd
import pytest
import yaml

from conftest import REPO, run_cli
from hybrid_lightning.analysis.load import find_runs, load_runs
from hybrid_lightning.analysis.pack import pack_runs
from hybrid_lightning.analysis.report import analyze
from hybrid_lightning.config import validate_config
from hybrid_lightning.plan.resolve import plan_run
from hybrid_lightning.rundir.files import write_plan
from test_analysis import fabricated  # noqa: F401 (a fixture: six fabricated runs, five done, one running)
from test_grid import TINY_BASE

TABLES = ("metrics", "records", "heads", "layers", "ablations")


def test_packed_runs_load_as_the_runs_did(fabricated, tmp_path):  # noqa: F811
    root, _ = fabricated
    packed = tmp_path / "packed"
    results = dict(pack_runs(root, packed))
    assert results["w64-s0"].startswith("skipped: running") and sum(v == "packed" for v in results.values()) == 5
    assert not list(packed.rglob("events.out.tfevents.*")) and (packed / "rope-s0" / "scalars.csv").is_file()
    done = [d for d in find_runs(root) if d.name != "w64-s0"]
    a, b = load_runs(done, root=root), load_runs(find_runs(packed), root=packed)
    for table in TABLES:
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table))
    pd.testing.assert_frame_equal(a.configs.drop(columns="path"), b.configs.drop(columns="path"))
    # the stored floats come back exactly
    rope = a.metrics[(a.metrics["run"] == "rope-s0") & (a.metrics["metric"] == "val/loss")]["value"].tolist()
    assert rope == b.metrics[(b.metrics["run"] == "rope-s0") & (b.metrics["metric"] == "val/loss")]["value"].tolist()

    assert set(dict(pack_runs(root, packed)).values()) >= {"unchanged"}  # packing again changes nothing
    copy = tmp_path / "copy"
    shutil.copytree(packed, copy)
    assert pack_runs(copy, tmp_path / "again") and all(
        (tmp_path / "again" / r / "scalars.csv").read_bytes() == (packed / r / "scalars.csv").read_bytes()
        for r in ("rope-s0", "full-s0"))

    first, second = analyze(packed, tmp_path / "out1", workers=1), analyze(packed, tmp_path / "out2", workers=1)
    for name in ("metrics.csv", "summary.csv", "emergence_curves.csv"):
        assert (first.parent / name).read_bytes() == (second.parent / name).read_bytes(), name
    # the folder's name is in no table
    assert (first.parent / "metrics.csv").read_bytes() == (
        analyze(copy, tmp_path / "out3", workers=1).parent / "metrics.csv").read_bytes()


def test_the_records_of_trace_are_packed_and_its_events_are_not(fabricated, tmp_path):  # noqa: F811
    """``hybrid-lightning trace`` writes tracing/step_<k>.json beside TensorBoard events: the records travel."""
    root, _ = fabricated
    tracing = root / "rope-s0" / "tracing"
    tracing.mkdir()
    (tracing / "step_40.json").write_text('{"step": 40}')
    (tracing / "events.out.tfevents.1.host.0").write_bytes(b"events")
    packed = tmp_path / "packed"
    pack_runs(root, packed)
    assert sorted(p.name for p in (packed / "rope-s0" / "tracing").iterdir()) == ["step_40.json"]
    assert (packed / "rope-s0" / "tracing" / "step_40.json").read_text() == '{"step": 40}'
    (tracing / "step_40.json").unlink()  # gone from the run: gone from its packed run
    assert dict(pack_runs(root, packed))["rope-s0"] == "packed" and not list((packed / "rope-s0").rglob("step_40*"))
    (packed / "rope-s0" / "tracing" / "deeper").mkdir(parents=True)
    (packed / "rope-s0" / "tracing" / "deeper" / "step_1.json").write_text("{}")
    with pytest.raises(ValueError, match="deeper/step_1.json, which pack did not write"):
        pack_runs(root, packed)


def test_unpack_fills_a_grid_root_and_keeps_what_is_there(fabricated, tmp_path):  # noqa: F811
    root, _ = fabricated
    packed = tmp_path / "packed"
    pack_runs(root, packed)
    grid_root = tmp_path / "grid"
    (grid_root / "rope-s0").mkdir(parents=True)
    (grid_root / "rope-s0" / "notes.txt").write_text("mine")
    r = run_cli("unpack", str(packed), "--into", str(grid_root))
    assert r.returncode == 0 and "4 packed runs copied" in r.stdout, r.stderr[-2000:]
    assert (grid_root / "rope-s0" / "notes.txt").read_text() == "mine"
    assert not (grid_root / "rope-s0" / "config.yaml").exists()
    assert (grid_root / "nope-s1" / "status.json").read_bytes() == (packed / "nope-s1" / "status.json").read_bytes()


@pytest.mark.parametrize("case", ["foreign file", "other config", "inside the runs", "a file"])
def test_pack_refuses_to_replace_what_it_did_not_write(fabricated, tmp_path, case):  # noqa: F811
    root, _ = fabricated
    out = tmp_path / "packed"
    pack_runs(root, out)
    target = out / "nope-s0"
    if case == "foreign file":
        (target / "notes.txt").write_text("mine")
        before, expected = (target / "notes.txt"), "which pack did not write"
    elif case == "other config":
        (target / "config.yaml").write_text("seed: 5\n")
        before, expected = (target / "config.yaml"), "another config"
    elif case == "a file":
        shutil.rmtree(target)
        target.write_text("mine")
        before, expected = target, "is a file"
    else:
        out, before, expected = root / "packed", None, "overlap"
    content = before.read_bytes() if before is not None else None
    r = run_cli("pack", str(root), "--out", str(out))
    assert r.returncode != 0 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    if before is not None:
        assert before.read_bytes() == content
    assert not (root / "packed").exists()


def test_runs_of_the_same_data_from_other_folders_are_one_architecture(tmp_path):
    """A study spanning sittings trains its cells from wherever the repository is: data.files differ by
    path, the data's fingerprint (provenance) does not."""
    from test_analysis import fabricate, run_config, tokens_scalars

    def config(seed, folder, tokens):
        cfg = run_config(seed)
        cfg["data"]["files"] = [f"/{folder}/runs/probes.jsonl"]
        cfg["provenance"]["data"] = {"sources": ["probes.jsonl"], "tokenizer": "byte", "tokens": tokens}
        return cfg

    for name, seed, folder, tokens in (("a-s0", 0, "sitting1", "d1"), ("a-s1", 1, "sitting2", "d1"),
                                       ("b-s0", 0, "sitting2", "d2")):
        cfg = config(seed, folder, tokens)
        fabricate(tmp_path / "runs" / name, cfg, "done", {"train/tokens": tokens_scalars(39)})
        # a run recording its data's fingerprint records its plan too
        trained = validate_config({k: v for k, v in cfg.items() if k != "provenance"})
        write_plan(tmp_path / "runs" / name, plan_run(trained, sources=False)[1])
    labels = load_runs(find_runs(tmp_path / "runs")).configs.set_index("run")["label"]
    assert labels["a-s0"] == labels["a-s1"] != labels["b-s0"], labels.to_dict()


def test_analyze_with_the_grid_needs_no_training_data(fabricated, tmp_path):  # noqa: F811
    """The committed packed runs of a study are analysed from a clone without runs/: the grid's data files
    do not exist there, and only its cells' names are needed."""
    root, _ = fabricated
    packed = tmp_path / "packed"
    pack_runs(root, packed)
    grid = tmp_path / "g.yaml"
    grid.write_text("base: {data: {files: [runs/missing/probes.jsonl]}}\naxes: {seed: [0, 1]}\n")
    r = run_cli("analyze", str(packed), "--grid", str(grid), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "seed=0" in (tmp_path / "out" / "report.md").read_text()  # a planned cell without a run directory
    assert "no file found" in run_cli("grid", "plan", str(grid)).stderr  # a grid to train still needs its data


@pytest.mark.slow
def test_a_grid_unpacked_in_another_checkout_finds_its_packed_cells_done(tmp_path):
    """A study spanning sittings: a cell trained in one checkout (its data there), packed, and unpacked
    into a grid root of another checkout (the same data at another path) counts as done there, not as a
    run of another config."""
    def checkout(name):
        folder = tmp_path / name
        (folder / "data").mkdir(parents=True)
        shutil.copy(REPO / "README.md", folder / "data" / "text.md")
        base = {**TINY_BASE, "train": {**TINY_BASE["train"], "max_steps": 3}, "data": {"files": ["data/text.md"]}}
        (folder / "g.yaml").write_text(yaml.safe_dump({"base": base, "root": "runs/g", "axes": {"seed": [0]}}))
        return folder

    first, second = checkout("first"), checkout("second")
    r = run_cli("grid", "submit", "g.yaml", "--executor", "local", cwd=first)
    assert r.returncode == 0, r.stderr[-2000:]
    assert run_cli("pack", "runs/g", "--out", str(tmp_path / "packed"), cwd=first).returncode == 0
    assert run_cli("unpack", str(tmp_path / "packed"), "--into", "runs/g", cwd=second).returncode == 0
    r = run_cli("grid", "submit", "g.yaml", "--executor", "local", cwd=second)
    assert r.returncode == 0 and "1 cells (1 done); 0 to submit" in r.stdout, r.stdout + r.stderr[-2000:]
    # Packed again from there, beside the grid's hparams events (no scalars): the same packed run.
    before = (tmp_path / "packed" / "seed=0" / "scalars.csv").read_bytes()
    assert "val/loss" in before.decode() and list((second / "runs" / "g" / "seed=0").glob("events.out.tfevents.*"))
    r = run_cli("pack", "runs/g", "--out", str(tmp_path / "packed"), cwd=second)
    assert r.returncode == 0 and "seed=0: unchanged" in r.stdout, r.stdout + r.stderr[-2000:]
    assert (tmp_path / "packed" / "seed=0" / "scalars.csv").read_bytes() == before
