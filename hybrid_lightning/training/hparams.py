"""The HParams dashboard's record of a run, written once per run directory (``write_session``): a plain run's
by its training (``callbacks.RunSummary``), a grid's cells' by ``grid submit`` (grid/tensorboard.py), each in an
event file of its own (``rundir.HPARAMS_SUFFIX``) beside the training's, which a resume leaves as it is."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hybrid_lightning.config import RunConfig
from hybrid_lightning.records import Tag
from hybrid_lightning.rundir import HPARAMS_SUFFIX
from hybrid_lightning.runplan import LAYOUT_KEYS, RunPlan

# The config keys a study of hybrids varies: the HParams dashboard compares runs by them, on these metrics.
STUDY_KEYS = (*LAYOUT_KEYS, "seed")
# The dashboard shows the first five of each at first: the headline metrics lead, and the hparams that differ
# between sessions (``_mark_differing``).
HPARAMS_METRICS = (Tag.SCORE, Tag.SCORE_BEYOND, Tag.LOSS, Tag.VAL_LOSS, Tag.RETRIEVAL_ACC, Tag.TEXT_LOSS,
                   Tag.SYNTHETIC_LOSS, Tag.LONGPPL)


def written(value: Any) -> str:
    """An HParams value as a config writes it (``16``, ``0.0003``, ``true``, ``rope``): the dashboard shows a number
    with three decimals (``16.000``), so every value is text, one type per hparam across runs."""
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def study_hparams(cfg: RunConfig, plan: RunPlan) -> dict[str, str]:
    """The ``STUDY_KEYS`` that apply to the run, as its plan has them (``RunPlan.layout``: no mixer nor efficient
    layers' position for all-full attention, no window without windowed layers), and its seed, each ``written``."""
    return {k: written(v) for k, v in {**plan.layout(), "seed": cfg.seed}.items()}


def _mark_differing(summary, experiment: Mapping[str, list]):
    """The experiment ``summary`` with its hparams marked as differing where sessions hold two values or more, and
    the seed always: the dashboard shows five hparams at first, those marked first, then by name, and would hide
    the seed behind five model keys."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    metadata = summary.value[0].metadata
    data = plugin_data_pb2.HParamsPluginData.FromString(metadata.plugin_data.content)
    for info in data.experiment.hparam_infos:
        info.differs = info.name == "seed" or len(experiment[info.name]) > 1
    metadata.plugin_data.content = data.SerializeToString()
    return summary


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
        # the experiment names every hparam of the grid, some of which this session lacks (they apply to other arms)
        summary = hparams({k: v[0] for k, v in experiment.items()}, dict.fromkeys(HPARAMS_METRICS, 0.0),
                          dict(experiment))[0]
        summaries.append(_mark_differing(summary, experiment))
    summaries.append(hparams(dict(values), {})[1])
    Path(folder).mkdir(parents=True, exist_ok=True)
    writer = FileWriter(str(folder), filename_suffix=HPARAMS_SUFFIX)
    for summary in summaries:
        writer.add_summary(summary)
    writer.close()
