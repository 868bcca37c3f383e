"""Damaged records are named, never passed on: ``pack`` and ``unpack`` refuse a run whose records do not read as
analysis reads them (config, plan, evaluation records, TensorBoard events, a packed run's scalars.csv), ``analyze``
reads past a damaged one with a warning naming it and what it dropped, and a token store whose document index was
changed in place or cut short is found damaged and prepared again."""

import json

import numpy as np
import pytest
import yaml

from conftest import TINY
from hybrid_lightning.analysis.load import damaged_records
from hybrid_lightning.cli import main
from hybrid_lightning.config import load_config, validate_config
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


def store_and_index(tmp_path):
    """(the data section of a store prepared in ``tmp_path/store``, its first document index)."""
    corpus = tmp_path / "docs.txt"
    corpus.write_text("one document of text. " * 400)
    data = validate_config({"data": {"files": [str(corpus)], "store": str(tmp_path / "store")}}).data
    return data, tmp_path / "store" / open_store(data).manifest["shards"][0]["docs"]


def test_a_bit_flip_in_a_document_index_is_found(tmp_path, capsys):
    data, index = store_and_index(tmp_path)
    store = open_store(data)
    lengths = np.load(index)
    lengths[0] += 1  # the same size, another value
    np.save(index, lengths)
    assert store.damaged() == str(index)
    capsys.readouterr()
    open_store(data, verify=True)  # data prepare: found damaged, prepared again
    assert "is damaged; preparing the store again" in capsys.readouterr().out
    assert open_store(data, verify=True).damaged() is None


def events_run(world_path):
    """A done run whose scalars are TensorBoard events (its scalars.csv gone), and its event file."""
    from torch.utils.tensorboard import SummaryWriter

    run = done_run(world_path)
    (run / "scalars.csv").unlink()
    with SummaryWriter(str(run)) as writer:
        for step in range(1, 21):
            writer.add_scalar("train/loss", 5.0 - step / 10, step)
    return run, next(run.glob("events.out.tfevents.*"))


def test_a_damaged_event_file_is_named_with_what_is_dropped(world, capsys):  # noqa: F811 (the fixture imported above)
    run, events = events_run(world)
    whole = events.read_bytes()
    for damaged in (whole[:-5], whole[: len(whole) // 2] + b"\xff" + whole[len(whole) // 2 + 1:]):
        events.write_bytes(damaged)  # cut short; a byte changed
        assert main(["analyze", str(run.parent), "--out", str(world / "a")]) == 0
        warning = capsys.readouterr().err
        assert f"{events}: damaged (" in warning and "the events after it are not read" in warning, warning
        line = refused(world, capsys, "pack", str(run.parent), "--out", str(world / "packed"))
        assert str(events) in line and "damaged" in line


def test_a_packed_runs_scalars_cut_short_damaged_or_gone_are_named(world, capsys):  # noqa: F811
    run = done_run(world)
    assert main(["pack", str(run.parent), "--out", str(world / "packed")]) == 0
    packed = world / "packed" / "run"
    scalars = packed / "scalars.csv"
    whole = scalars.read_text()
    for text, said in ((whole[:-3], "cut short"), ("step,metric,value\nnot a number,x,y\n", "its scalars are dropped")):
        scalars.write_text(text)
        capsys.readouterr()
        assert main(["analyze", str(world / "packed"), "--out", str(world / "a")]) == 0
        warning = capsys.readouterr().err
        assert f"{scalars}: " in warning and said in warning, warning
        line = refused(world, capsys, "unpack", str(world / "packed"), "--into", str(world / "root"))
        assert str(scalars) in line and said in line
    scalars.unlink()
    assert main(["analyze", str(world / "packed"), "--out", str(world / "a")]) == 0
    assert "its training curves are missing" in capsys.readouterr().err
    line = refused(world, capsys, "unpack", str(world / "packed"), "--into", str(world / "root"))
    assert str(packed) in line and "training curves are missing" in line


def test_a_document_index_cut_short_is_refused_and_prepared_again(tmp_path, capsys):
    data, index = store_and_index(tmp_path)
    whole = index.read_bytes()
    index.write_bytes(whole[:-3])
    with pytest.raises(ValueError, match=f"{index} is missing or not the size the manifest says"):
        open_store(data)  # train: refused, naming it and what prepares it again
    capsys.readouterr()
    open_store(data, verify=True)  # data prepare: prepared again
    assert f"{index} is damaged; preparing the store again" in capsys.readouterr().out
    assert index.read_bytes() == whole


def test_a_missing_plan_is_named_missing_not_older(world):  # noqa: F811 (the fixture imported above)
    from hybrid_lightning.plan.resolve import plan_run
    from hybrid_lightning.rundir.files import read_plan
    from hybrid_lightning.training.resume import Resume, check_numbering

    run = done_run(world)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert read_plan(run).rebuilt  # no plan.json and a provenance of before plans: an older run, rebuilt
    config["provenance"]["data"] = {"tokens": "b421a7af6fd77ea55f77"}  # recorded since before plan.json
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=r"plan.json is missing, though config.yaml was written by a version"):
        read_plan(run)
    _, plan = plan_run(load_config(None, TINY[1::2]))  # a resume checks its numbering by its checkpoint's plan
    check_numbering(run, Resume(run / "checkpoints" / "last.ckpt", 1, None, None, plan.as_dict()))
    config["provenance"]["layers"] = [{"layer": 0, "kind": "swa", "window": 32, "pos": "rope"},
                                      {"layer": 1, "kind": "full", "window": None, "pos": "rope"}]
    (run / "config.yaml").write_text(yaml.safe_dump(config))  # layers in the provenance: before plan.json
    assert read_plan(run).rebuilt
