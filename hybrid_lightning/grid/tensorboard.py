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

from typing import Any

from hybrid_lightning.grid.spec import Grid, format_value
from hybrid_lightning.rundir import HPARAMS_SUFFIX as SUFFIX
from hybrid_lightning.training.hparams import study_hparams, write_session


def _hparam_values(values: list[Any]) -> list[Any]:
    """HParams accepts numbers, strings and booleans, one type per hparam: anything else is spelled."""
    if all(isinstance(v, bool) for v in values) or all(isinstance(v, str) for v in values):
        return values
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return [float(v) for v in values]
    return [format_value(v) for v in values]


def write_hparams(grid: Grid) -> None:
    """Writes every cell's session and, with the first cell's, the experiment summary (call under the grid's
    lock); a cell that has its session keeps it (``hparams.write_session``). Files of an older layout at the
    grid's root are removed."""
    sessions = [_session_values(grid, cell) for cell in grid.cells]
    domains = {key: list(dict.fromkeys(values[key] for values in sessions)) for key in sessions[0]}
    for old in grid.root.glob(f"events.out.tfevents.*{SUFFIX}"):
        old.unlink()
    for i, (cell, values) in enumerate(zip(grid.cells, sessions)):
        write_session(cell.run_dir, values, domains if i == 0 else None)


def _session_values(grid: Grid, cell) -> dict[str, Any]:
    """A cell's hparams: its axis values (a preset's name for a preset axis), then the study keys the axes leave out."""
    values = {axis: _hparam_values(grid.axes[axis])[_index(grid.axes[axis], v)] for axis, v in cell.labels.items()}
    return values | {k: v for k, v in study_hparams(cell.config).items() if k not in values}


def _index(values: list[Any], value: Any) -> int:
    spelled = [format_value(v) for v in values]
    return spelled.index(format_value(value))
