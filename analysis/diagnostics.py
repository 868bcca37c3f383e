"""The paper's diagnostics across runs (the records of ``restrict``, ``probe-layers`` and ``gradient``,
records.DIAGNOSTICS, and of the retrieval heads' tracing, records.TRACING): one tidy table per kind with each run's
architecture label and seed, the seed summaries, and the figures of Qiao et al. 2026 (arXiv 2606.15378, Finding
2): scores and LongPPL under each restriction, probe accuracy by layer with the full-attention layers marked,
gradient influence against distance on log axes, the target heads' entropy and Q/K distance against training
tokens. Reads the run directory only."""

from __future__ import annotations

from pathlib import Path

import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from hybrid_lightning.analysis.figures import arm_colors, legend, save, wrap
from hybrid_lightning.analysis.stats import mean_ci
from hybrid_lightning.kinds import FULL
from hybrid_lightning.records import columns
from hybrid_lightning.rundir import TRACING_DIR, eval_files
from hybrid_lightning.rundir.evals import read_eval_record, traced_heads

TRACED = ("mass", "entropy_norm", "qk_rel_l2")  # what the tracing figure draws, a panel each
INTERVAL = "95% t interval of the mean over seeds"  # the bands and whiskers of every figure here


def diagnostic_rows(configs: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The ``kind`` rows (a key of ``records.DIAGNOSTICS``) of each run's newest record of that kind, with the run's
    ``run``, ``label`` and ``seed`` (``configs``: ``load_runs(...).configs``) and ``restriction``: ``none``, or
    ``LAYERS:R``."""
    frames = []
    for run in configs.itertuples():
        found = [(step, path) for k, step, path in eval_files(Path(run.path)) if k == kind]
        record = read_eval_record(max(found)[1]) if found else None
        if record and record.get(kind):
            frames.append(pd.DataFrame(record[kind]).assign(run=run.run, label=run.label, seed=run.seed))
    if not frames:
        return pd.DataFrame(columns=[*columns(kind), "run", "label", "seed", "restriction"])
    out = pd.concat(frames, ignore_index=True)
    out["restriction"] = [f"{p}:{int(r)}" if isinstance(p, str) else "none"
                          for p, r in zip(out["layers"], out["receptive_field"])]
    return out


def seed_summary(rows: pd.DataFrame, keys: list[str], measure: str) -> pd.DataFrame:
    """``measure`` per ``keys`` over seeds: mean, min, max, the number of seeds and the 95% t interval of the mean
    (``ci_low``, ``ci_high``; NaN with one seed)."""
    groups = rows.groupby(keys, dropna=False)[measure]
    out = groups.agg(["mean", "min", "max", "count"]).rename(columns={"count": "seeds"})
    ci = groups.apply(lambda v: mean_ci(v.to_numpy()))
    out["ci_low"], out["ci_high"] = [c[0] for c in ci], [c[1] for c in ci]
    return out.reset_index()


def restriction_figure(rows: pd.DataFrame, measures: tuple[str, ...] = ("score", "longppl")) -> Figure:
    """Per measure, one group of bars per architecture, one bar per restriction: seed mean, whiskers its 95% t
    interval."""
    fig = Figure(figsize=(4 + 1.2 * rows["label"].nunique(), 3.6 * len(measures)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(measures), 1))
    setups = list(dict.fromkeys(rows["restriction"]))
    colors = arm_colors(setups)
    labels = sorted(rows["label"].unique())
    for ax, measure in zip(axes, measures):
        s = seed_summary(rows.dropna(subset=[measure]), ["label", "restriction"], measure)
        width = 0.8 / max(1, len(setups))
        for j, setup in enumerate(setups):
            c = s[s["restriction"] == setup].set_index("label").reindex(labels)
            x = np.arange(len(labels)) + j * width
            ax.bar(x, c["mean"], width, color=colors[setup], label="unrestricted" if setup == "none"
                   else f"{setup.replace(':', ' layers, last ')} tokens")
            ax.errorbar(x, c["mean"], yerr=[c["mean"] - c["ci_low"], c["ci_high"] - c["mean"]], fmt="none",
                        color="black", lw=0.8)
        ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels, rotation=20, ha="right", fontsize=7)
        ax.set_ylabel(measure)
        legend(ax)
    fig.suptitle(wrap(f"Receptive-field restriction (bar: seed mean, whiskers: {INTERVAL}; seeds per bar: "
                      "diagnostics_restricted.csv)"), fontsize=9)
    return fig


def layer_probe_figure(rows: pd.DataFrame, feature: str = "residual") -> Figure:
    """Held-out probe accuracy by layer, one line per architecture (seed mean, band its 95% t interval), the
    full-attention layers' points filled and the others hollow; chance dotted."""
    rows = rows[(rows["feature"] == feature) & (rows["restriction"] == "none")]
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    labels = sorted(rows["label"].unique())
    colors = arm_colors(labels)
    for label in labels:
        part = rows[rows["label"] == label]
        s = seed_summary(part, ["layer", "mixer"], "accuracy").sort_values("layer")
        ax.plot(s["layer"], s["mean"], color=colors[label], label=f"{label} ({int(s['seeds'].max())} seeds)")
        ax.fill_between(s["layer"], s["ci_low"], s["ci_high"], color=colors[label], alpha=0.2, lw=0)
        full = s["mixer"] == FULL
        ax.scatter(s["layer"][full], s["mean"][full], color=colors[label], s=28, zorder=3)
        ax.scatter(s["layer"][~full], s["mean"][~full], facecolors="white", edgecolors=colors[label], s=28, zorder=3)
    if len(rows):
        ax.axhline(1 / rows["classes"].max(), color="grey", lw=0.6, ls=":")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("layer (filled: full attention, hollow: efficient)")
    ax.set_ylabel(f"probe accuracy ({feature})")
    legend(ax)
    fig.suptitle(wrap(f"Layer-wise probes of the needle's value at the last token (line: seed mean, band: {INTERVAL})"),
                 fontsize=9)
    return fig


def gradient_figure(rows: pd.DataFrame) -> Figure:
    """Mean gradient norm against distance + 1 on log axes, one line per architecture and restriction (seed mean,
    band its 95% t interval)."""
    rows = rows.dropna(subset=["mean_grad_norm"])
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    curves = list(dict.fromkeys(zip(rows["label"], rows["restriction"])))
    colors = arm_colors(sorted({c[0] for c in curves}))
    for label, setup in curves:
        c = rows[(rows["label"] == label) & (rows["restriction"] == setup)]
        s = seed_summary(c, ["distance"], "mean_grad_norm")
        name = label if setup == "none" else f"{label}, {setup.replace(':', ' layers last ')}"
        ax.plot(s["distance"] + 1, s["mean"], color=colors[label], ls="-" if setup == "none" else "--",
                label=f"{name} ({int(s['seeds'].max())} seeds)")
        ax.fill_between(s["distance"] + 1, s["ci_low"], s["ci_high"], color=colors[label], alpha=0.15, lw=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("distance to the last token + 1")
    ax.set_ylabel("gradient norm")
    legend(ax)
    fig.suptitle(wrap(f"Gradient influence by distance (line: seed mean, band: {INTERVAL})"), fontsize=9)
    return fig


def trace_rows(configs: pd.DataFrame, _: str = "trace") -> pd.DataFrame:
    """Each run's traced target heads at every traced step, with their attention mass: from ``hybrid-lightning
    trace`` (``tracing/step_<k>.json``; ``source`` ``final``: the final checkpoint's top heads) where the run has
    it, else from training (``eval/trace_step_<k>.json``, ``eval.trace``; ``source`` ``live``: each step's own
    top heads); with ``run``, ``label`` and ``seed``."""
    frames = []
    for run in configs.itertuples():
        offline = sorted((Path(run.path) / TRACING_DIR).glob("step_*.json"))
        paths = offline or [path for kind, _, path in eval_files(Path(run.path)) if kind == "trace"]
        for record in filter(None, map(read_eval_record, paths)):
            frames.append(pd.DataFrame(traced_heads(record)).assign(run=run.run, label=run.label, seed=run.seed,
                                                    source="final" if offline else "live"))
    if not frames:
        return pd.DataFrame(columns=[*columns("trace"), "mass", "run", "label", "seed", "source"])
    return pd.concat(frames, ignore_index=True)


def tracing_figure(rows: pd.DataFrame) -> Figure:
    """Per measure of ``TRACED``, one line per architecture against training tokens: each run's mean over its target
    heads, then the seed mean, band its 95% t interval."""
    fig = Figure(figsize=(7.5, 3.0 * len(TRACED)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(TRACED), 1, sharex=True))
    per_run = rows.groupby(["label", "run", "tokens", "source"], as_index=False)[list(TRACED)].mean()
    labels = sorted(per_run["label"].unique())
    colors = arm_colors(labels)
    for ax, measure in zip(axes, TRACED):
        for label in labels:
            part = per_run[per_run["label"] == label]
            s = seed_summary(part, ["tokens"], measure).sort_values("tokens")
            heads = "final heads" if (part["source"] == "final").all() else "each step's heads"
            ax.plot(s["tokens"], s["mean"], color=colors[label], marker=".",
                    label=f"{label} ({int(s['seeds'].max())} seeds, {heads})")
            ax.fill_between(s["tokens"], s["ci_low"], s["ci_high"], color=colors[label], alpha=0.2, lw=0)
        ax.set_ylabel(measure)
    axes[-1].set_xlabel("training tokens")
    legend(axes[0])
    fig.suptitle(wrap("Target retrieval heads over training: attention mass on the needle, normalised entropy, Q/K "
                      f"distance to the reference (line: seed mean of each run's heads' mean, band: {INTERVAL})"),
                 fontsize=9)
    return fig


# kind -> (figure file, how it is drawn, what records it, how its rows are read): the report's diagnostics, in order
FIGURES = {"restricted": ("restriction.png", restriction_figure, "receptive-field restriction (`restrict`)",
                          diagnostic_rows),
           "layer_probe": ("layer_probes.png", layer_probe_figure, "layer-wise probes (`probe-layers`)",
                           diagnostic_rows),
           "gradient": ("gradient.png", gradient_figure, "gradient influence (`gradient`)", diagnostic_rows),
           "trace": ("tracing.png", tracing_figure, "retrieval-head tracing (`trace`, `eval.trace`)", trace_rows)}


def report_section(configs: pd.DataFrame, out: Path, heading: str) -> str:
    """``report.md``'s section on the diagnostics: per kind that any run recorded, its figure and
    ``diagnostics_<kind>.csv`` (``diagnostic_rows``) written into ``out``; one line where none did."""
    text = [f"{heading}\n", "The newest record of each kind per run (`eval/<kind>_step_<k>.json`), every traced step "
            f"for the tracing; seed means with the {INTERVAL} (none with one seed; docs/evaluation.md defines each "
            "measure).\n"]
    drawn = []
    for kind, (png, draw, what, read) in FIGURES.items():
        rows = read(configs, kind)
        if rows.empty:
            continue
        rows.to_csv(out / f"diagnostics_{kind}.csv", index=False)
        save(draw(rows), out / png)
        drawn.append(what)
        text += [f"![{kind}]({png})\n", f"CSV: `diagnostics_{kind}.csv`.\n"]
    if not drawn:
        return "\n".join(text[:1] + ["No run has a diagnostics record: `hybrid-lightning restrict`, `probe-layers`, "
                                      "`gradient` and `trace` (or `eval.trace` during training) write them into the "
                                      "run directory.\n"])
    return "\n".join(text)
