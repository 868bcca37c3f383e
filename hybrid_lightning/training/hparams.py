"""The HParams dashboard's record of a run, written once per run directory (``write_session``): a plain run's
by its training (``callbacks.RunSummary``), a grid's cells' by ``grid submit`` (grid/tensorboard.py), each in an
event file of its own (``rundir.HPARAMS_SUFFIX``) beside the training's, which a resume leaves as it is."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hybrid_lightning.config import RunConfig, config_to_dict, flatten
from hybrid_lightning.records import Tag
from hybrid_lightning.rundir import HPARAMS_SUFFIX

# The config keys a study of hybrids varies: the HParams dashboard compares runs by them, on these metrics.
STUDY_KEYS = ("model.pattern", "model.mixer", "model.window", "model.pos.full", "model.pos.efficient", "seed")
HPARAMS_METRICS = (Tag.LOSS, Tag.VAL_LOSS, Tag.TEXT_LOSS, Tag.SYNTHETIC_LOSS, Tag.RETRIEVAL_ACC, Tag.SCORE, Tag.SCORE_BEYOND,
                   Tag.LONGPPL)


def study_hparams(cfg: RunConfig) -> dict[str, float | str]:
    """``STUDY_KEYS`` of ``cfg`` as HParams values (numbers as floats: one type per hparam across runs)."""
    flat = flatten(config_to_dict(cfg))
    return {k: float(flat[k]) if isinstance(flat[k], int) else flat[k] for k in STUDY_KEYS}


def has_session(folder: Path) -> bool:
    return any(Path(folder).glob(f"events.out.tfevents.*{HPARAMS_SUFFIX}"))


def write_session(folder: Path, values: Mapping[str, Any], experiment: Mapping[str, list] | None = None) -> None:
    """Writes ``folder``'s HParams session of ``values`` unless it has one; with ``experiment`` (each hparam's
    values), the experiment summary too, naming them and ``HPARAMS_METRICS`` (the same metrics for every run, so
    that the summary the dashboard picks among several fits them all)."""
    if has_session(folder):
        return
    from torch.utils.tensorboard.summary import hparams
    from torch.utils.tensorboard.writer import FileWriter

    summaries = []
    if experiment is not None:
        summaries.append(hparams(dict(values), dict.fromkeys(HPARAMS_METRICS, 0.0), dict(experiment))[0])
    summaries.append(hparams(dict(values), {})[1])
    Path(folder).mkdir(parents=True, exist_ok=True)
    writer = FileWriter(str(folder), filename_suffix=HPARAMS_SUFFIX)
    for summary in summaries:
        writer.add_summary(summary)
    writer.close()
