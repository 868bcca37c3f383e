"""The run directory's evaluation records (hybrid_lightning/rundir/__init__.py, rundir/evals.py): paths, listing
and the one writer that the evaluation callbacks and the offline commands share."""

import json

from hybrid_lightning.rundir import eval_files, eval_path
from hybrid_lightning.rundir.evals import read_eval_record, write_eval_record


def test_eval_records_merge_rows_by_key_and_derive_fields_from_the_merge(tmp_path):
    merge = {"rows": ("task", "masked")}

    def total(record):
        return {"total": sum(r["value"] for r in record["rows"])}

    old = {"step": 7, "note": "old",
           "rows": [{"task": "a", "masked": [[0, 1]], "value": 1}, {"task": "b", "masked": [], "value": 2}]}
    path = write_eval_record(tmp_path, "heads", old, merge, total)
    assert path == eval_path(tmp_path, "heads", 7) == tmp_path / "eval" / "heads_step_7.json"
    assert read_eval_record(path)["total"] == 3
    new = {"step": 7, "note": "new", "rows": [{"task": "a", "masked": [[0, 1]], "value": 10}]}
    write_eval_record(tmp_path, "heads", new, merge, total)
    merged = read_eval_record(path)
    assert merged["note"] == "new"  # fields outside merge are replaced
    assert merged["rows"] == [{"task": "b", "masked": [], "value": 2}, {"task": "a", "masked": [[0, 1]], "value": 10}]
    assert merged["total"] == 12
    write_eval_record(tmp_path, "heads", {"step": 7, "rows": []})  # without merge: the file is replaced
    assert read_eval_record(path) == {"step": 7, "rows": []}


def test_eval_files_lists_records_by_kind_and_step(tmp_path):
    write_eval_record(tmp_path, "longctx", {"step": 19, "records": []})
    write_eval_record(tmp_path, "longctx", {"step": 9, "records": []})
    write_eval_record(tmp_path, "heads", {"step": 9})
    (tmp_path / "eval" / "notes.json").write_text("{}")
    (tmp_path / "eval" / "step_3.json.tmp").write_text("{")
    assert [(kind, step) for kind, step, _ in eval_files(tmp_path)] == [("heads", 9), ("longctx", 19), ("longctx", 9)]
    assert json.loads(eval_path(tmp_path, "longctx", 9).read_text()) == {"step": 9, "records": []}
    (tmp_path / "eval" / "step_5.json").write_text('{"step": ')  # half written elsewhere
    assert read_eval_record(tmp_path / "eval" / "step_5.json") is None
    assert eval_files(tmp_path / "missing") == []
