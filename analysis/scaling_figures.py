"""Figures of the scaling fits (analysis/scaling.py), with the conventions of analysis/figures.py: constrained
layout, legends right of the axes, wrapped titles."""

from __future__ import annotations

import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure

from hybrid_lightning.analysis.figures import arm_colors, legend, wrap
from hybrid_lightning.analysis.scaling import ScalingFit
from hybrid_lightning.units import si


def laws(fits: dict[str, ScalingFit], ylabel: str) -> Figure:
    """One panel per architecture (``fits``: label -> its fit): the measured quantity against training tokens
    per parameter, one colour per size; filled points were fitted, open ones held out and predicted; lines are
    the fitted law at each size, dashed at the held-out size."""
    cols = min(3, len(fits))
    rows = -(-len(fits) // cols)
    fig = Figure(figsize=(4.4 * cols + 1.6, 0.8 + 3.2 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, (label, fit) in zip(axes, fits.items()):
        held = fit.held_out.rename(columns={"actual": "quantity"})
        cells = [(fit.fitted, True), (held, False)]
        sizes = sorted({*fit.fitted["n"], *held["n"]})
        colors = arm_colors([str(n) for n in sizes])
        k = np.geomspace(min(c["tokens"].min() / c["n"].max() for c, _ in cells if len(c)) / 1.5,
                         max(c["tokens"].max() / c["n"].min() for c, _ in cells if len(c)) * 1.5, 100)
        for n in sizes:
            color = colors[str(n)]
            is_held = bool((held["n"] == n).any())
            ax.plot(k, fit.law.value(n, k * n), color=color, lw=1, ls="--" if is_held else "-",
                    label=f"N={si(n)}" + (" (held out)" if is_held else ""))
            for c, filled in cells:
                at = c[c["n"] == n]
                ax.scatter(at["tokens"] / at["n"], at["quantity"], s=18, color=color if filled else "none",
                           edgecolors=color, zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.tick_params(axis="y", which="both", labelsize=7)
        ax.set_xlabel("training tokens per non-embedding parameter (D / N)", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(wrap(f"{label}: {_formula(fit)}", 50), fontsize=8)
        ax.grid(alpha=0.3, which="both")
        legend(ax)
    for ax in axes[len(fits):]:
        ax.set_visible(False)
    fig.suptitle(wrap("Scaling laws fitted per architecture (filled: fitted cells; open: held out and predicted; "
                      "dashed: the law at the held-out size)"), fontsize=9)
    return fig


def _formula(fit: ScalingFit) -> str:
    """The law with its parameters, e.g. ``e^4.69 N^-0.249 + e^7.99 D^-0.356``."""
    p = fit.law.params
    text = f"e^{p['B']:.3g} N^-{p['alpha']:.3g} + e^{p['C']:.3g} D^-{p['beta']:.3g}"
    return f"e^{p['A']:.3g} + {text}" if "A" in p else text
