"""TensorBoard over a grid: ``tensorboard --logdir <root>`` shows each cell as a run, and the HParams
dashboard compares cells by their axes.

The grid's root gets the experiment summary (each axis with its values, and the metrics to
compare); each cell's run directory gets a session naming its axis values. The HParams plugin
reads a session's metrics from the newest value of those scalars in the cell's run, so the
table holds each cell's final ``train/loss``, validation metrics and, when the long-context
evaluation ran, ``longctx/score`` (lengths up to ``train.seq_len``), ``longctx/score_beyond`` (longer
ones) and ``longctx/longppl``, and with ``data.text_val_files`` ``val/text_loss`` (absent values stay empty).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybrid_lightning.grid.spec import Grid, format_value

METRICS = ("train/loss", "val/loss", "val/text_loss", "val/synthetic_loss", "val/retrieval_acc", "longctx/score",
           "longctx/score_beyond", "longctx/longppl")
SUFFIX = ".hparams"  # the event files this module writes, told apart from the training logs


def _hparam_values(values: list[Any]) -> list[Any]:
    """HParams accepts numbers, strings and booleans, one type per hparam: anything else is spelled."""
    if all(isinstance(v, bool) for v in values) or all(isinstance(v, str) for v in values):
        return values
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return [float(v) for v in values]
    return [format_value(v) for v in values]


def _write(folder: Path, summaries: list) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder), filename_suffix=SUFFIX)
    for summary in summaries:
        writer._get_file_writer().add_summary(summary)
    writer.close()


def write_hparams(grid: Grid) -> None:
    """(Re)writes the experiment summary at the grid's root and a session in each cell's run
    directory that has none yet (call under the grid's lock)."""
    from torch.utils.tensorboard.summary import hparams

    domains = {axis: _hparam_values(values) for axis, values in grid.axes.items()}
    grid.root.mkdir(parents=True, exist_ok=True)
    for old in grid.root.glob(f"events.out.tfevents.*{SUFFIX}"):
        old.unlink()
    first = {axis: domain[0] for axis, domain in domains.items()}
    experiment, _, _ = hparams(first, dict.fromkeys(METRICS, 0.0), _discrete(domains))
    _write(grid.root, [experiment])
    for cell in grid.cells:
        if any(cell.run_dir.glob(f"events.out.tfevents.*{SUFFIX}")):
            continue
        cell.run_dir.mkdir(parents=True, exist_ok=True)
        values = {axis: _hparam_values(grid.axes[axis])[_index(grid.axes[axis], v)] for axis, v in cell.labels.items()}
        _, session, _ = hparams(values, {})
        _write(cell.run_dir, [session])


def _discrete(domains: dict[str, list]) -> dict[str, list]:
    """Distinct values per axis, order kept (an axis may repeat a value inside zip groups)."""
    return {axis: list(dict.fromkeys(values)) for axis, values in domains.items()}


def _index(values: list[Any], value: Any) -> int:
    spelled = [format_value(v) for v in values]
    return spelled.index(format_value(value))
