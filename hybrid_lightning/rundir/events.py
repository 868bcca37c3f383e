"""A run's TensorBoard event files, read."""

from __future__ import annotations

import logging
from pathlib import Path


def read_events(run_dir: Path, scalars: int = 0):
    """The run's TensorBoard events, loaded: an ``EventAccumulator`` keeping up to ``scalars`` values per
    scalar tag (0 = all; the newest is always kept) and one of every other kind, or None without event
    files. Steps that a resume purged are excluded."""
    if not any(Path(run_dir).glob("events.out.tfevents.*")):
        return None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": scalars, "tensors": 1, "images": 1, "histograms": 1,
                                                        "audio": 1, "compressedHistograms": 1})
    tb_log = logging.getLogger("tensorboard")
    level = tb_log.level
    tb_log.setLevel(logging.ERROR)  # a resumed run's purge is expected, not worth a warning here
    try:
        acc.Reload()
    finally:
        tb_log.setLevel(level)
    return acc
