"""The report's figures (matplotlib, Agg): each a function of tables from analysis/tables.py that
returns a ``Figure``; ``save`` writes it as PNG. Legends sit outside the axes (right of them, in the
space constrained layout makes for them) and titles are wrapped, so that neither covers data nor runs
off the figure however many architectures there are."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from hybrid_lightning.kinds import FULL

DPI = 110
TITLE_WIDTH = 90  # characters per title line at the suptitle's font size
LABEL_WIDTH = 32  # characters per legend line: longer run names wrap instead of widening the legend
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":")


def save(fig: Figure, path: Path) -> Path:
    """Writes ``fig`` as PNG. Every figure here uses constrained layout, which fits legends beside the axes
    and wrapped titles inside the figure (``bbox_inches="tight"`` would cost a second render per figure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def wrap(title: str, width: int = TITLE_WIDTH) -> str:
    """A title broken into lines of at most ``width`` characters."""
    return textwrap.fill(title, width)


def legend(ax) -> None:
    """The curves' legend of ``ax`` right of it, its top level with the axes' top (below the figure's title), in
    one column (two beyond 12 entries); constrained layout narrows the axes to make room for it."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0, fontsize=7,
              ncols=1 if len(ax.get_legend_handles_labels()[1]) <= 12 else 2)


def file_name(name: str) -> str:
    """A run or architecture name as a file name: characters other than letters, digits and ``._=-`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name).strip("_") or "run"


def _band(ax, c: pd.DataFrame, label: str, style: dict) -> None:
    """Seed mean as a line with markers and the min-max range as a band (``curves`` rows of one architecture),
    drawn in the architecture's ``style`` (``arm_styles``)."""
    seeds = int(c["seeds"].max())
    ax.plot(c["tokens"], c["mean"], **style, label=_legend_text(label, f"({seeds} seed{'s' * (seeds > 1)})"))
    if seeds > 1:
        ax.fill_between(c["tokens"], c["min"], c["max"], color=style["color"], alpha=0.2, lw=0)


def _token_axis(ax) -> None:
    ax.set_xlabel("training tokens seen")
    ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))  # 250k, 1.5M


def arm_styles(labels: list[str]) -> dict[str, dict]:
    """A colour, marker and dash per architecture, the markers and lines smaller for each later one, so that
    curves that coincide still show each architecture's marker around the next one's."""
    cmap = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"]
    n = max(len(labels) - 1, 1)
    return {label: {"color": cmap(i % cmap.N), "marker": MARKERS[i % len(MARKERS)], "ls": DASHES[i % len(DASHES)],
                    "ms": 8 - 5 * i / n, "lw": 2.2 - 1.2 * i / n, "mfc": "none" if i % 2 else None}
            for i, label in enumerate(labels)}


def arm_colors(labels: list[str]) -> dict[str, tuple]:
    """A colour per label, ``arm_styles``' own, for figures that draw their own markers."""
    return {label: style["color"] for label, style in arm_styles(labels).items()}


def _noise_lines(ax, noise: pd.Series, styles: dict[str, dict], z: float) -> None:
    """Each architecture's noise level (``tables.noise_levels``: ``z`` null standard errors of its seed mean) as a
    thin dotted line in its colour, or one grey line where they share it."""
    noise = noise.dropna()
    if noise.empty:
        return
    text = f"noise: {z:g} null SE of the seed mean"
    if np.allclose(noise.to_numpy(), noise.iloc[0], rtol=0.01):
        ax.axhline(noise.iloc[0], color="grey", lw=1, ls=(0, (2, 2)), label=text)
        return
    for i, (label, level) in enumerate(noise.items()):
        ax.axhline(level, color=styles[label]["color"], lw=0.8, ls=(0, (2, 2)), label=text if i == 0 else None)


def _legend_text(label: str, note: str) -> str:
    """``label`` wrapped at ``LABEL_WIDTH`` with ``note`` after it, on its last line where it fits."""
    text = wrap(label, LABEL_WIDTH)
    return text + (" " if len(text.splitlines()[-1]) + 1 + len(note) <= LABEL_WIDTH else "\n") + note


def _height(labels: list[str], least: float = 4.2) -> float:
    """A figure height (inches) that fits the legend of ``labels`` as ``_band`` wraps them and ``legend`` lays
    them out (in two columns beyond 12), with a line for a level or threshold."""
    lines = sum(len(_legend_text(label, "(10 seeds)").splitlines()) for label in labels)
    return max(least, 1.0 + 0.17 * (-(-lines // (1 if len(labels) <= 12 else 2)) + 2))


def _none(ax, text: str) -> None:
    """An axes with nothing to draw says so, on a 0-1 scale rather than matplotlib's empty +-0.04."""
    ax.set_ylim(0, 1)
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="grey")


def _bands(curve: pd.DataFrame) -> tuple[Figure, Any, list[str], dict[str, dict]]:
    """A figure with one ``_band`` per architecture of ``curve`` (``curves`` rows): (figure, axes, the
    architectures, their ``arm_styles``)."""
    labels = sorted(curve["label"].unique())
    fig = Figure(figsize=(7.5, _height(labels)), layout="constrained")
    ax = fig.subplots()
    styles = arm_styles(labels)
    for label in labels:
        _band(ax, curve[curve["label"] == label], label, styles[label])
    return fig, ax, labels, styles


def emergence(curve: pd.DataFrame, ylabel: str, noise: pd.Series | None = None, z: float = 3.0) -> Figure:
    """Score vs training tokens, one curve per architecture: seed mean, band = min-max over seeds; with ``noise``
    (architecture -> level), the level above which the verdicts count a signal (``z`` null SE)."""
    fig, ax, labels, styles = _bands(curve)
    ax.axhline(0, color="grey", lw=0.6, ls=":")
    if noise is not None:
        _noise_lines(ax, noise.reindex(labels), styles, z)
    _token_axis(ax)
    ax.set_ylabel(ylabel)
    fig.suptitle(wrap("Emergence of long-context ability (line: seed mean, band: min-max over seeds"
                      + (f"; dotted: {z:g} null SE, the verdicts' signal level)" if noise is not None else ")")),
                 fontsize=9)
    legend(ax)
    ax.grid(alpha=0.3)
    return fig


def longppl(curve: pd.DataFrame) -> Figure:
    """LongPPL vs training tokens on a log axis, one curve per architecture: seed mean, band = min-max over seeds
    (``curves`` of ``Tag.LONGPPL``)."""
    fig, ax, _, _ = _bands(curve)
    ax.set_yscale("log")
    _token_axis(ax)
    ax.set_ylabel("LongPPL (on the evaluator's key tokens)")
    fig.suptitle(wrap("LongPPL over training (line: seed mean, band: min-max over seeds)"), fontsize=9)
    legend(ax)
    ax.grid(alpha=0.3, which="both")
    return fig


def laziness(head_curves: dict[str, pd.DataFrame], threshold_line: float | None) -> Figure:
    """Retrieval-head count and the highest head score vs training tokens, one curve per architecture
    (the label names the SWA window); ``head_curves`` maps ``heads/retrieval_heads`` and ``heads/max_score``
    to their ``curves`` tables."""
    labels = sorted(set().union(*(c["label"] for c in head_curves.values())))
    fig = Figure(figsize=(11, _height(labels)), layout="constrained")
    axes = fig.subplots(1, 2)
    styles = arm_styles(labels)
    panels = (("heads/retrieval_heads", "retrieval heads (count, score > threshold)"),
              ("heads/max_score", "highest retrieval score of any head (share of answer tokens)"))
    for ax, (tag, ylabel) in zip(axes, panels):
        c = head_curves[tag]
        for label in labels:
            if (c["label"] == label).any():
                _band(ax, c[c["label"] == label], label, styles[label])
        _token_axis(ax)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
    counts = head_curves["heads/retrieval_heads"]
    if counts.empty or not (counts["max"] > 0).any():
        _none(axes[0], "none: no run has a retrieval head")
    axes[0].yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    if threshold_line is not None:
        axes[1].axhline(threshold_line, color="grey", lw=1, ls=(0, (2, 2)),
                        label=f"threshold {threshold_line:g}: a retrieval head above it")
    legend(axes[1])
    fig.suptitle(wrap("Retrieval-head formation by SWA window (line: seed mean, band: min-max over seeds)"), fontsize=9)
    return fig


def niah_heatmap(cells: pd.DataFrame, title: str, value_label: str) -> Figure:
    """One run's ``niah`` rows: needle depth (rows) x probe length (columns), one panel per task."""
    tasks = list(dict.fromkeys(cells["task"]))
    fig = Figure(figsize=(3.2 + 2.4 * len(tasks), 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(tasks)))
    lo, hi = min(0.0, cells["value"].min()), max(1.0, cells["value"].max())
    for ax, task in zip(axes, tasks):
        grid = cells[cells["task"] == task].pivot_table(index="depth", columns="length", values="value")
        image = ax.imshow(grid.to_numpy(), vmin=lo, vmax=hi, cmap="viridis", aspect="auto")
        for (i, j), v in np.ndenumerate(grid.to_numpy()):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if v < lo + 0.6 * (hi - lo) else "black")
        ax.set_xticks(range(grid.shape[1]), [str(n) for n in grid.columns], fontsize=7)
        ax.set_yticks(range(grid.shape[0]), [f"{d:g}" for d in grid.index], fontsize=7)
        ax.set_xlabel("probe length (tokens)", fontsize=8)
        ax.set_ylabel("needle depth (0 = start, 1 = end)", fontsize=8)
        ax.set_title(task, fontsize=9)
    # unit on a line of its own
    fig.colorbar(image, ax=axes.tolist(), shrink=0.8, label=value_label.replace(" (", "\n("))
    fig.suptitle(wrap(title, 20 + 30 * len(tasks)), fontsize=9)
    return fig


def head_maps(maps: pd.DataFrame, threshold: float = 0.1) -> Figure:
    """Retrieval score by layer (rows) and head (columns), one panel per architecture; layer names say
    full or efficient (``swa/<W>``), grey rows are not attention (recurrent mixers). The colour scale
    ends at the highest score, or at twice the retrieval-head ``threshold`` if that is higher."""
    labels = list(dict.fromkeys(maps["label"]))
    cols = min(3, len(labels))
    rows = -(-len(labels) // cols)
    fig = Figure(figsize=(4.2 * cols, 0.8 + 2.6 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")
    vmax = max(2 * threshold, float(maps["score"].max()) if maps["score"].notna().any() else 0.0)
    image = None
    for ax, label in zip(axes, labels):
        m = maps[maps["label"] == label]
        layers = m.drop_duplicates("layer").sort_values("layer")
        n_heads = int(m["head"].max()) + 1 if m["head"].notna().any() else 1
        grid = np.full((len(layers), n_heads), np.nan)
        for r in m.dropna(subset=["head"]).itertuples():
            grid[int(r.layer), int(r.head)] = r.score
        image = ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=vmax, cmap=cmap, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, "n/a" if np.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if v < 0.6 * vmax else "black")
        names = [f"{int(r.layer)} {r.mixer}" + (f"/{int(r.window)}" if pd.notna(r.window) else "")
                 + ("" if r.applicable else " (not attn)") for r in layers.itertuples()]
        ax.set_yticks(range(len(layers)), names, fontsize=7)
        for tick, mixer in zip(ax.get_yticklabels(), layers["mixer"]):
            tick.set_fontweight("bold" if mixer == FULL else "normal")
        ax.set_xticks(range(n_heads), [str(h) for h in range(n_heads)], fontsize=7)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer (bold: full attention)", fontsize=8)
        ax.set_title(wrap(label, 45), fontsize=8)
    for ax in axes[len(labels):]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes.tolist(), shrink=0.8, label="retrieval score\n(share of answer tokens copied)")
    fig.suptitle(wrap("Retrieval score per head at the last scored step, mean over seeds"), fontsize=9)
    return fig
