"""A run's TensorBoard event files, read, and their damage named: TensorBoard's reader stops at a record that fails
its checksum or is cut short and says nothing (a debug line), so the readers here catch that line."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

_DAMAGE = "Truncated record in %s (%s)"  # tensorboard's event_file_loader: the record it stopped at, at debug level


class _Damage(logging.Filter):
    """On tensorboard's logger while events are read: keeps each damaged record's line, lets through only errors
    (a resumed run's purge warnings are expected, not worth a line)."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _DAMAGE:
            path, error = record.args
            why = re.search(r"(truncated record.*|failed .*)$", str(error))  # after the file's name, as bytes
            self.found.append(f"{path}: damaged ({why[0] if why else error}); the events after it are not read")
        return record.levelno >= logging.ERROR


def load_events(run_dir: Path, scalars: int = 0):
    """(the run's events, loaded, or None without event files; one line per damaged event file). See ``read_events``."""
    if not any(Path(run_dir).glob("events.out.tfevents.*")):
        return None, []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": scalars, "tensors": 1, "images": 1, "histograms": 1,
                                                        "audio": 1, "compressedHistograms": 1})
    tb_log, damage = logging.getLogger("tensorboard"), _Damage()
    level = tb_log.level
    tb_log.setLevel(logging.DEBUG)  # the damaged record's line is a debug line; the filter keeps it, drops the rest
    tb_log.addFilter(damage)
    try:
        acc.Reload()
    finally:
        tb_log.removeFilter(damage)
        tb_log.setLevel(level)
    return acc, damage.found


def read_events(run_dir: Path, scalars: int = 0):
    """The run's TensorBoard events, loaded: an ``EventAccumulator`` keeping up to ``scalars`` values per
    scalar tag (0 = all; the newest is always kept) and one of every other kind, or None without event
    files. Steps that a resume purged are excluded. An event file damaged (a record that fails its checksum or is
    cut short) is read up to that record, and a line on stderr names it and what is dropped."""
    acc, damaged = load_events(run_dir, scalars)
    for line in damaged:
        print(f"warning: {line}", file=sys.stderr)
    return acc
