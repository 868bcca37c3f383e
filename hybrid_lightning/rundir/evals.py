"""A run's evaluation records (``eval/<prefix><step>.json``, ``EVAL_KINDS``): read one, and write one, merging its
rows into the record already at that step; a tracing record's target heads with their mass (``traced_heads``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hybrid_lightning.fileio import write_atomic
from hybrid_lightning.rundir import eval_path
from hybrid_lightning.rundir.legacy import upgraded_record


def read_eval_record(path: Path) -> dict | None:
    """An evaluation record, or None where it does not read (records are written whole or not at all, so damaged);
    one an older version wrote reads as today's (``legacy.upgraded_record``)."""
    try:
        return upgraded_record(json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        return None


def write_eval_record(run_dir: Path, kind: str, record: dict, merge: Mapping[str, Sequence[str]] | None = None,
                      derived: Callable[[dict], dict] | None = None) -> Path:
    """Writes (or merges into) the ``kind`` record at ``record["step"]``; returns its path.

    Args:
        run_dir: the run directory.
        kind: a key of ``EVAL_KINDS``.
        record: the new record.
        merge: list field -> the row fields that identify a row: rows of the existing file whose key
            the new record's rows lack are kept, before the new rows. Other fields are replaced.
        derived: fields computed from the merged record (e.g. a score over all rows), set last.
    """
    path = eval_path(run_dir, kind, record["step"])
    path.parent.mkdir(parents=True, exist_ok=True)
    merged, merge = dict(record), merge or {}
    old = (read_eval_record(path) or {}) if merge else {}
    for name, keys in merge.items():
        def key(row: dict, keys: Sequence[str] = keys) -> tuple:
            return tuple(json.dumps(row.get(k)) for k in keys)  # JSON: fields may hold lists; a row may lack some

        new = record.get(name, [])
        replaced = {key(r) for r in new}
        merged[name] = [r for r in old.get(name, []) if key(r) not in replaced] + new
    if derived is not None:
        merged.update(derived(merged))
    write_atomic(path, json.dumps(merged, indent=1))
    return path


def traced_heads(record: dict) -> list[dict]:
    """A tracing record's ``trace`` rows (``records.TRACING``), each with its head's attention ``mass`` from the
    record's ``mass`` rows (None where they lack it)."""
    mass = {(r["layer"], r["head"]): r["mass"] for r in record.get("mass", [])}
    return [r | {"mass": mass.get((r["layer"], r["head"]))} for r in record.get("trace", [])]
