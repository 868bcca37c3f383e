"""Damaged records are named, never passed on: ``pack`` and ``unpack`` refuse a run whose records do not read as
analysis reads them, ``analyze`` skips a damaged evaluation record with a warning naming it, and a token store
whose document index was changed in place is found damaged and prepared again."""

import json

import numpy as np

from hybrid_lightning.analysis.load import damaged_records
from hybrid_lightning.cli import main
from hybrid_lightning.config import validate_config
from hybrid_lightning.data.store import open_store
from test_refusals import fabricated_run, refused, world  # noqa: F401  (world: the fixture)


def done_run(world_path):
    run = fabricated_run(world_path)
    (run / "status.json").write_text(json.dumps({"state": "done", "step": 1, "max_steps": 1}))
    (run / "eval").mkdir()
    return run


def test_pack_refuses_a_run_whose_config_is_cut_short(world, capsys):  # noqa: F811 (the fixture imported above)
    run = done_run(world)
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text[: text.index("provenance")])  # training writes provenance last
    line = refused(world, capsys, "pack", str(run.parent), "--out", str(world / "packed"))
    assert "config.yaml" in line and "cut short" in line


def test_unpack_refuses_garbage_records(world, capsys):  # noqa: F811 (the fixture imported above)
    run = done_run(world)
    assert main(["pack", str(run.parent), "--out", str(world / "packed")]) == 0
    packed = world / "packed" / "run"
    (packed / "eval").mkdir(exist_ok=True)
    (packed / "eval" / "step_3.json").write_text("{not json")
    assert damaged_records(packed) == [f"{packed / 'eval' / 'step_3.json'}: not an evaluation record"]
    capsys.readouterr()
    line = refused(world, capsys, "unpack", str(world / "packed"), "--into", str(world / "root"))
    assert "step_3.json" in line
    (packed / "eval" / "step_3.json").unlink()
    (packed / "scalars.csv").write_text("step,metric,value\nnot a number,x,y\n")
    assert "scalars.csv" in refused(world, capsys, "unpack", str(world / "packed"), "--into", str(world / "root"))


def test_analyze_skips_a_damaged_record_with_a_warning(world, capsys):  # noqa: F811 (the fixture imported above)
    run = done_run(world)
    (run / "eval" / "step_3.json").write_text("[]")
    assert main(["analyze", str(run.parent), "--out", str(world / "a")]) == 0
    err = capsys.readouterr().err
    assert f"skipping {run / 'eval' / 'step_3.json'}" in err


def test_a_bit_flip_in_a_document_index_is_found(tmp_path, capsys):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("one document of text. " * 400)
    data = validate_config({"data": {"files": [str(corpus)], "store": str(tmp_path / "store")}}).data
    store = open_store(data)
    index = tmp_path / "store" / store.manifest["shards"][0]["docs"]
    lengths = np.load(index)
    lengths[0] += 1  # the same size, another value
    np.save(index, lengths)
    assert store.damaged() == str(index)
    capsys.readouterr()
    open_store(data, verify=True)  # data prepare: found damaged, prepared again
    assert "is damaged; preparing the store again" in capsys.readouterr().out
    assert open_store(data, verify=True).damaged() is None
