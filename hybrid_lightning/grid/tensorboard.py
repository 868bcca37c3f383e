"""TensorBoard over a grid: ``tensorboard --logdir <root>`` shows each cell as a run, and the HParams
dashboard compares cells by their axes and by the keys a study varies that apply to each (``training.hparams``:
pattern, mixer, window, positional encodings as the cell's plan has them, seed), each value as written.

Each cell's run directory gets a session naming its values; the first cell's also holds the experiment
summary (each hparam with its values, and the metrics to compare), so that the grid's root holds no
event file, which TensorBoard would list as a stray run ``.``. The HParams plugin reads a session's
metrics from the newest value of those scalars in the cell's run, so the table holds each cell's final
``train/loss``, validation metrics (``val/text_loss`` with ``data.text_val_files``) and, when the long-context
evaluation ran, ``val_longctx/score`` (lengths up to ``train.seq_len``), ``val_longctx/score_beyond`` (longer ones) and
``val_longctx/longppl`` (absent values stay empty).

The CUSTOM SCALARS tab leads with every cell's headline (training/layout.py); ``write_seed_runs`` adds, for each
arm with several seeds, its mean and range over them (``grid tensorboard``, and the local executor when it ends).
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean

from hybrid_lightning.grid.spec import Grid, format_value
from hybrid_lightning.records import HEADLINE
from hybrid_lightning.rundir import HPARAMS_SUFFIX as SUFFIX
from hybrid_lightning.rundir.events import read_events
from hybrid_lightning.training.hparams import study_hparams, write_session
from hybrid_lightning.training.layout import SEED_STATS, seeds_layout

SEEDS_DIR = "seeds"  # under a grid's root: one TensorBoard run per arm with several seeds (write_seed_runs)


def write_hparams(grid: Grid) -> None:
    """Writes every cell's session and, with the first cell's, the experiment summary (call under the grid's
    lock); a cell that has its session keeps it (``hparams.write_session``). Files of an older layout at the
    grid's root are removed."""
    sessions = [_session_values(cell) for cell in grid.cells]
    keys = dict.fromkeys(key for values in sessions for key in values)
    domains = {key: list(dict.fromkeys(values[key] for values in sessions if key in values)) for key in keys}
    for old in grid.root.glob(f"events.out.tfevents.*{SUFFIX}"):
        old.unlink()
    for i, (cell, values) in enumerate(zip(grid.cells, sessions)):
        write_session(cell.run_dir, values, domains if i == 0 else None)


def _session_values(cell) -> dict[str, str]:
    """A cell's hparams: its axis values as the grid writes them (a preset's name for a preset axis), then the
    study keys that apply to it and the axes leave out (``hparams.study_hparams``)."""
    values = {axis: format_value(v) for axis, v in cell.labels.items()}
    return values | {k: v for k, v in study_hparams(cell.config, cell.plan).items() if k not in values}


def write_seed_runs(grid: Grid) -> list[Path]:
    """For each arm of the grid (cells alike but for their ``seed`` axis value) with two seeds or more, the run
    ``<root>/seeds/<arm>`` (``SEEDS_DIR``): at each step that two of its seeds or more logged, the mean over them of
    each headline tag (``records.HEADLINE``), their lowest and their highest, under the tag with the suffixes of
    ``layout.SEED_STATS``, with the layout whose margin charts draw them (``layout.seeds_layout``). Written anew
    from the cells' events each time (the folder's earlier event files replaced). Returns the folders written."""
    from torch.utils.tensorboard import SummaryWriter

    written = []
    for arm, cells in _arms(grid).items():
        series = [_headline(cell.run_dir) for cell in cells]
        folder = grid.root / SEEDS_DIR / arm
        for old in folder.glob("events.out.tfevents.*"):
            old.unlink()
        writer = SummaryWriter(str(folder))
        writer.add_custom_scalars(seeds_layout())
        for tag in dict.fromkeys(t for tags in HEADLINE.values() for t in tags):
            for step in sorted({s for run in series for s in run.get(tag, {})}):
                values = [run[tag][step] for run in series if step in run.get(tag, {})]
                if len(values) >= 2:
                    for suffix, value in zip(SEED_STATS, (mean(values), min(values), max(values))):
                        writer.add_scalar(tag + suffix, value, step)
        writer.close()
        written.append(folder)
    return written


def _arms(grid: Grid) -> dict[str, list]:
    """Arm name (the cells' name without the seed) -> its cells, for the arms with two seeds or more."""
    arms: dict[str, list] = {}
    for cell in grid.cells:
        if "seed" in cell.labels:
            arms.setdefault(grid.name_of({k: v for k, v in cell.labels.items() if k != "seed"}), []).append(cell)
    return {arm: cells for arm, cells in arms.items() if len(cells) >= 2}


def _headline(run_dir: Path) -> dict[str, dict[int, float]]:
    """The run's headline tags: tag -> step -> value (none before it logged any)."""
    acc = read_events(run_dir)
    if acc is None:
        return {}
    present = set(acc.Tags()["scalars"])
    return {tag: {e.step: e.value for e in acc.Scalars(tag)}
            for tags in HEADLINE.values() for tag in tags if tag in present}
