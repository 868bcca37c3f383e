"""A run's scalars as analysis reads them: its TensorBoard events' (``rundir.events``), or a packed run's
``scalars.csv`` (analysis/pack.py), each checked as it is read: a damaged record is read up to the damage, and named
with what is dropped; a done run whose scalars are gone is named too."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from hybrid_lightning.records import Tag
from hybrid_lightning.rundir import SCALARS_FILE
from hybrid_lightning.rundir.events import load_events

# TensorBoard scalars read by default; the others are skipped while reading.
TAGS = (Tag.LOSS, Tag.TOKENS, Tag.VAL_LOSS, Tag.TEXT_LOSS, Tag.SYNTHETIC_LOSS, Tag.RETRIEVAL_ACC, Tag.LONGPPL)
SCALAR_COLUMNS = ["step", "metric", "value"]  # read_scalars' table, and a packed run's scalars.csv


def read_scalars(run_dir: Path, tags: Iterable[str] = TAGS) -> pd.DataFrame:
    """The run's TensorBoard scalars of ``tags``: columns step, metric, value (steps a resume purged excluded);
    a packed run's (analysis/pack.py) from its ``scalars.csv``. What is damaged is read up to the damage, and a
    line on stderr names it and what is dropped (``scalar_records``)."""
    scalars, damaged = scalar_records(run_dir, tags)
    for line in damaged:
        print(f"warning: {line}", file=sys.stderr)
    return scalars


def scalar_records(run_dir: Path, tags: Iterable[str] = TAGS) -> tuple[pd.DataFrame, list[str]]:
    """(``read_scalars``'s table, a line per damaged record: an event file, or a packed run's scalars.csv)."""
    tags = tuple(tags)
    acc, damaged = load_events(run_dir)
    present = set(acc.Tags()["scalars"]) if acc is not None else set()
    # A packed run, also once unpacked into a grid's root, where the grid's hparams events (no scalars) join it.
    path = Path(run_dir) / SCALARS_FILE
    if not present and path.is_file():
        packed, problem = _packed_scalars(path)
        kept = packed[packed["metric"].isin(tags)].reset_index(drop=True)
        return kept, damaged + [f"{path}: {problem}"] * bool(problem)
    rows = [(e.step, tag, e.value) for tag in tags if tag in present for e in acc.Scalars(tag)]
    return pd.DataFrame(rows, columns=SCALAR_COLUMNS), damaged


def _packed_scalars(path: Path) -> tuple[pd.DataFrame, str | None]:
    """(the rows of a packed run's scalars.csv, None), or the rows before the damage with what is wrong: a file cut
    short (pack ends it with a newline) loses its last line, one that does not read as step,metric,value rows all."""
    text = path.read_bytes()
    problem = None
    if text and not text.endswith(b"\n"):
        text = text[: text.rfind(b"\n") + 1]
        problem = "cut short (its last line has no end); that line is dropped"
    try:
        frame = pd.read_csv(io.BytesIO(text), dtype={"step": "int64", "metric": str, "value": "float64"})
        if list(frame.columns) != SCALAR_COLUMNS or frame[["step", "metric"]].isna().any(axis=None):
            raise ValueError(f"columns {list(frame.columns)} or an empty step or metric")
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        why = f"not rows of {','.join(SCALAR_COLUMNS)} ({e}); its scalars are dropped"
        return pd.DataFrame(columns=SCALAR_COLUMNS), why
    return frame, problem


def missing_scalars(run_dir: Path, status: dict, scalars: pd.DataFrame) -> list[str]:
    """A line for a done run whose scalars are gone: neither its TensorBoard events nor a packed run's scalars.csv
    hold any (training logs at its last step at least)."""
    if status.get("state") != "done" or len(scalars) or (Path(run_dir) / SCALARS_FILE).is_file():
        return []
    return [f"{run_dir}: done, but neither TensorBoard events nor {SCALARS_FILE} hold its scalars (deleted?); its "
            "training curves are missing"]
