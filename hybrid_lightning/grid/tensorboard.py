"""TensorBoard over a grid: ``tensorboard --logdir <root>`` shows each cell as a run, and the HParams
dashboard compares cells by their axes and by the keys a study varies (``training.callbacks.STUDY_KEYS``:
pattern, mixer, window, positional encodings, seed).

Each cell's run directory gets a session naming its values; the first cell's also holds the experiment
summary (each hparam with its values, and the metrics to compare), so that the grid's root holds no
event file, which TensorBoard would list as a stray run ``.``. The HParams plugin reads a session's
metrics from the newest value of those scalars in the cell's run, so the table holds each cell's final
``train/loss``, validation metrics (``val/text_loss`` with ``data.text_val_files``) and, when the long-context
evaluation ran, ``val_longctx/score`` (lengths up to ``train.seq_len``), ``val_longctx/score_beyond`` (longer ones) and
``val_longctx/longppl`` (absent values stay empty).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybrid_lightning.grid.spec import Grid, format_value
from hybrid_lightning.rundir import HPARAMS_SUFFIX as SUFFIX
from hybrid_lightning.training.callbacks import HPARAMS_METRICS as METRICS
from hybrid_lightning.training.callbacks import study_hparams


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
    """Writes every cell's session and, with the first cell's, the experiment summary (call under
    the grid's lock). Files of an older layout at the grid's root are removed."""
    from torch.utils.tensorboard.summary import hparams

    sessions = [_session_values(grid, cell) for cell in grid.cells]
    domains = {key: list(dict.fromkeys(values[key] for values in sessions)) for key in sessions[0]}
    for old in grid.root.glob(f"events.out.tfevents.*{SUFFIX}"):
        old.unlink()
    experiment, _, _ = hparams(sessions[0], dict.fromkeys(METRICS, 0.0), domains)
    for i, (cell, values) in enumerate(zip(grid.cells, sessions)):
        _, session, _ = hparams(values, {})
        _rewrite(cell.run_dir, [experiment, session] if i == 0 else [session])


def _rewrite(folder: Path, summaries: list) -> None:
    """Writes ``summaries`` as the folder's hparams file unless it has one: a resubmitted grid leaves the
    files of its cells, finished ones included, untouched (as their names, their values do not change)."""
    if any(folder.glob(f"events.out.tfevents.*{SUFFIX}")):
        return
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder, summaries)


def _session_values(grid: Grid, cell) -> dict[str, Any]:
    """A cell's hparams: its axis values (a preset's name for a preset axis), then the study keys the axes leave out."""
    values = {axis: _hparam_values(grid.axes[axis])[_index(grid.axes[axis], v)] for axis, v in cell.labels.items()}
    return values | {k: v for k, v in study_hparams(cell.config).items() if k not in values}


def _index(values: list[Any], value: Any) -> int:
    spelled = [format_value(v) for v in values]
    return spelled.index(format_value(value))
