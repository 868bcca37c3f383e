"""The evaluation records have one definition (hybrid_lightning/records.py): the writers' rows, the docs'
tables and analysis's columns come from it, and the long-context pooling is one function."""

import ast
import json

import pandas as pd
import pytest

from conftest import REPO
from hybrid_lightning import records
from hybrid_lightning.analysis.scores import pooled as pooled_frame
from hybrid_lightning.records import pool

CELL = {"step": 3, "tokens": 96, "task": "passkey", "length": 256, "depth": 0.5, "in_window": None, "n": 2,
        "accuracy": 0.5, "answer_tokens": 10, "token_accuracy": 0.6, "answer_loss": 1.2, "chance_token_accuracy": 0.1,
        "chance_loss": 2.3, "distance": 4.0, "generated": 0, "generated_exact": None, "match_all": None,
        "match_part": None}
MIN_LISTED = 7  # fields of one record kind in one literal list that count as writing out its columns


def docs_text() -> str:
    return "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))] if p.is_file())


@pytest.mark.parametrize("kind", list(records.KINDS))
def test_the_docs_table_row_is_generated_from_the_definition(kind):
    """Each list of the evaluation files is documented by exactly the row ``records.docs_row`` makes."""
    assert records.docs_row(kind) in docs_text().splitlines(), f"paste records.docs_row({kind!r}) into the docs"


def test_a_row_has_every_field_in_order_and_refuses_others():
    assert list(records.row("records", **CELL)) == list(records.columns("records")) == list(CELL)
    with pytest.raises(TypeError):
        records.row("records", **{k: v for k, v in CELL.items() if k != "n"})
    with pytest.raises(TypeError, match="no fields"):
        records.row("records", **CELL, extra=1)
    assert records.columns("layers")[-1] == "reach_retrieval_heads"  # a kind of two parts: place, then counts


def test_the_evaluation_and_analysis_pool_alike():
    """eval.report.pool (lists of dicts) and analysis.scores.pooled (frames) give the same figures."""
    cells = [CELL, CELL | {"depth": 1.0, "n": 3, "accuracy": 1 / 3, "answer_tokens": 15, "token_accuracy": 0.2,
                           "answer_loss": 2.0, "chance_token_accuracy": 0.3, "chance_loss": 2.0, "generated": 3,
                           "generated_exact": 1 / 3, "match_all": 0.5, "match_part": 0.5}]
    p = pool(cells, task="passkey")
    frame = pooled_frame(pd.DataFrame(cells), ["task"]).iloc[0]
    assert p["accuracy"] == pytest.approx(2 / 5) == frame["exact"]
    assert p["token_accuracy"] == pytest.approx((6 + 3) / 25)
    assert p["chance_loss"] == pytest.approx((23 + 30) / 25)
    # the chance accuracy pools as the token measures do (the format-only predictor's, probes/chance.py)
    assert p["chance_token_accuracy"] == pytest.approx((1 + 4.5) / 25)
    assert frame["score"] == pytest.approx(p["score"]) == pytest.approx((9 - 5.5) / 25)
    assert frame["loss_gain"] == pytest.approx(p["chance_loss"] - p["answer_loss"])
    assert p["generated"] == 3 and p["match_all"] == 0.5  # generation measures over the decoded cell only
    assert pool(cells[:1])["match_all"] is None


def _field_lists(path):
    """String tuples/lists of MIN_LISTED+ items in a source file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) >= MIN_LISTED:
            if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                yield node.lineno, [e.value for e in node.elts]


def test_no_module_lists_a_records_fields_again():
    """Outside records.py no source writes out the columns of a record kind (``MIN_LISTED`` or more of its
    fields, besides step and tokens, in one literal list; a handful of measures or row keys is a choice)."""
    fields = {kind: set(records.columns(kind)) - {"step", "tokens", "run"} for kind in records.KINDS}
    found = []
    for path in sorted([*(REPO / "hybrid_lightning").rglob("*.py"), *(REPO / "analysis").rglob("*.py")]):
        if path.name == "records.py":
            continue
        for line, names in _field_lists(path):
            named = set(names) - {"step", "tokens", "run"}
            for kind, own in fields.items():
                if len(named) >= MIN_LISTED and named <= own:
                    found.append(f"{path.relative_to(REPO)}:{line} lists fields of {kind!r}: {names}")
    assert not found, "\n".join(found)


def test_records_written_when_a_layers_mixer_was_named_kind_read_as_today(tmp_path):
    """The fourth replica's records name a layer's mixer ``kind`` (tests/data/legacy/heads_kind.json: its seed 0 of
    SWA-8 at step 4,000): read through ``read_eval_record`` (every reader's path) their rows carry ``mixer`` in its
    place, and today's records are left as they are."""
    from hybrid_lightning.rundir.evals import read_eval_record

    old = REPO / "tests" / "data" / "legacy" / "heads_kind.json"
    assert '"kind"' in old.read_text()
    record = read_eval_record(old)
    assert list(record["heads"][0]) == list(records.columns("heads"))
    assert [r["mixer"] for r in record["layers"]] == ["swa", "swa", "swa", "full"]
    today = {"step": 1, "layers": [records.row("layers", step=1, tokens=2, layer=0, mixer="full", window=None,
                                               pos="rope", applicable=True, **dict.fromkeys(
                                                   records.columns("layers")[7:]))]}
    (tmp_path / "r.json").write_text(json.dumps(today))
    assert read_eval_record(tmp_path / "r.json") == today
