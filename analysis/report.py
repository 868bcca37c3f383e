"""``hybrid-lightning analyze``: run directories -> CSV tables, PNG figures and ``report.md`` (docs/analysis.md)."""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path

import pandas as pd

from hybrid_lightning.analysis import diagnostics, figures, scaling_runs, tables
from hybrid_lightning.analysis.emergence import SIGNAL_Z
from hybrid_lightning.analysis.load import Runs, load_runs
from hybrid_lightning.analysis.metrics import METRIC_AXIS, METRIC_TEXT, SCORE, metric_tag, record_metric
from hybrid_lightning.fileio import publish
from hybrid_lightning.records import Tag
from hybrid_lightning.rundir import runs_under
from hybrid_lightning.units import si

POS_KEYS = ("model.pos.full", "model.pos.efficient")
MARKER = ".hybrid-lightning-analysis"  # in an output folder: the files analyze wrote there (fileio.publish)


def analyze(folder: str | Path, out: str | Path | None = None, metric: str = "score",
            planned: list[tuple[str, Path, str | None]] | None = None, workers: int | None = None,
            findings: bool = False, exploratory: Collection[Path] = (), declared: dict | None = None) -> Path:
    """Reads every run under ``folder`` and writes the tables, figures and ``report.md`` into ``out``.

    Args:
        folder: a grid root or any folder of run directories (searched recursively, ``.grid/`` skipped).
        out: output folder; default ``<folder>/analysis``.
        metric: the long-context score (``analysis.metrics.METRICS``).
        planned: the cells of a grid as (name, run directory, why it failed or None): the report lists those
            without a run directory, failed or not started (the command line reads them from ``--grid``).
        workers: processes reading runs; default up to 4, one per CPU.
        findings: open the report with the verdicts on the paper's three findings (analysis/findings.py).
        exploratory: run directories of exploratory arms (a grid's ``exploratory`` cells): reported, left out of
            the verdicts.
        declared: what the grid declares for its verdicts (``grid.schema.VerdictsSpec.declared``); None: the
            defaults.
    Returns: the path of report.md.
    """
    tag = metric_tag(metric)
    folder = Path(folder)
    dirs = runs_under(folder)
    out = Path(out) if out is not None else folder / "analysis"
    runs = load_runs(dirs, root=folder, workers=workers or min(4, os.cpu_count() or 1))  # every run read first
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))  # beside out: every file, then moved in
    try:
        aside = {Path(p).resolve() for p in exploratory}
        _report(runs, folder, staging, metric, tag, planned, (aside, declared) if findings else None)
        publish(staging, out, MARKER, "--out")
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # the package's own temporary folder
    return out / "report.md"


def _report(runs: Runs, folder: Path, out: Path, metric: str, tag: str,
            planned: list[tuple[str, Path, str | None]] | None, findings: tuple[set[Path], dict | None] | None) -> None:
    """Writes every table, figure and report.md of ``runs`` into ``out``, opened by the verdicts where
    ``findings`` gives what they read besides the runs: (exploratory run directories, declarations)."""
    sections = [f"# Analysis of {folder}\n",
                f"Runs: {len(runs.configs)}; architectures: {runs.configs['label'].nunique()}. Long-context score "
                f"(`--metric {metric}`): {METRIC_TEXT[metric]}. Spread over seeds: min-max range (figures, "
                "`*_min`/`*_max` columns) and sample standard deviation (`std`).\n",
                _missing(runs, planned, tag)]
    if findings is not None:
        sections.insert(2, _findings(runs, out, *findings))
    _write(runs.metrics, out, "metrics.csv")
    # run: its path under the folder, the same on any machine
    _write(runs.configs.drop(columns="path"), out, "runs.csv")
    summary = tables.summary(runs.metrics, runs.configs, metric)
    sections += [_emergence(runs, out, metric, tag), _laziness(runs, out), _niah(runs, out, metric),
                 _pos(runs, out, metric, summary), _head_maps(runs, out), _ablation(runs, out), _summary(summary, out),
                 scaling_runs.report_section(runs, out, "## 8. Scaling laws"),
                 diagnostics.report_section(runs.configs, out,
                                            "## 9. Diagnostics: restriction, probes, gradients, tracing")]
    (out / "report.md").write_text("\n".join(sections))


def _findings(runs: Runs, out: Path, exploratory: set[Path], declared: dict | None) -> str:
    from hybrid_lightning.analysis.findings import markdown, verdicts

    c = runs.configs
    aside = c[c["path"].map(lambda p: Path(p).resolve() in exploratory).astype(bool)]
    confirmatory = runs.without(set(aside["run"]))
    tests, comparisons = verdicts(confirmatory, declared)
    _write(tests, out, "findings.csv")
    _write(comparisons, out, "findings_comparisons.csv")
    table = markdown(tests, comparisons)
    if len(aside):
        arms = ", ".join(f"`{label}` ({n} runs)" for label, n in aside.groupby("label").size().items())
        table += (f"\nExploratory arms, declared in the grid (`exploratory`), reported in the sections below and left "
                  f"out of every verdict: {arms}.\n")
    (out / "findings.md").write_text(table)
    c = confirmatory.configs
    return "\n".join([
        "## Findings of the paper at this scale\n",
        "Each verdict follows a fixed rule (`analysis/findings.py` states the rules) on the comparison its "
        "finding claims: the effect over seeds with its 95% interval (Welch's t), a permutation or log-rank p and "
        "the p after Holm's adjustment over the claims of the finding; `reproduced` needs 3 seeds per compared "
        "arm, an adjusted p < 0.05 in the paper's direction and an interval on that side of 0, `refuted` the same "
        "in the opposite one, otherwise `inconclusive` with the reason; `no signal`: the phenomenon the test looks "
        "at did not appear in any run; `not tested`: the runs lack what the test needs; `not testable`: the design "
        "cannot tell what the test asks (the reason says why); `not testable at this budget`: the runs end before "
        "it can be seen. A `context` comparison is shown beside a claim and decides nothing. "
        f"These runs: {len(c)}, {_scale(c)}. CSV: `findings.csv` (one row per test), "
        "`findings_comparisons.csv`.\n",
        table,
        "\nWhat a proper test needs: the paper's scale (15M-477M non-embedding parameters, 100N-1000N tokens: "
        "`ablations/paper.yaml`), natural long documents rather than synthetic retrieval sequences, enough seeds "
        "per compared arm (a permutation p of two arms of 3 seeds cannot fall below 0.10; `hybrid-lightning grid "
        "plan GRID --verdicts` states each test's floor and the seeds for 80% power before a grid trains), and "
        "evaluations dense around the step where retrieval emerges.\n",
    ])


def _scale(configs: pd.DataFrame) -> str:
    """Non-embedding parameters N (from each run's provenance), training tokens and tokens per parameter;
    ``unknown`` for the runs whose provenance lacks the counts (written before training recorded them)."""
    budget = configs["train.max_steps"] * configs["tokens_per_step"]
    params = pd.to_numeric(configs["non_embedding_params"], errors="coerce")
    tokens = f"{si(budget.min())}-{si(budget.max())} training tokens"
    known = params.notna()
    if not known.any():
        return f"unknown non-embedding parameters N, {tokens}"
    n = budget[known] / params[known]
    unknown = "" if known.all() else f"; N unknown for {int((~known).sum())} of {len(known)} runs"
    return (f"{si(params.min())}-{si(params.max())} non-embedding parameters N, {tokens} "
            f"({n.min():.3g}N-{n.max():.3g}N{unknown})")


def _missing(runs: Runs, planned: list[tuple[str, Path, str | None]] | None, tag: str) -> str:
    lines = ["## What is missing"]
    if planned is not None:
        found = {Path(p).resolve() for p in runs.configs["path"]}
        absent = [(name, failure) for name, run_dir, failure in planned if run_dir.resolve() not in found]
        failed = [f"`{n}` ({failure})" for n, failure in absent if failure]
        idle = [f"`{n}`" for n, failure in absent if not failure]
        lines.append(f"Grid: {len(planned)} planned cells, {len(planned) - len(absent)} with a run directory"
                     + (f"; failed before it: {', '.join(failed)}" if failed else "")
                     + (f"; not started: {', '.join(idle)}" if idle else "") + ".")
    c = runs.configs
    unfinished = c[c["state"] != "done"]
    logged = runs.metrics.groupby("run")["step"].max()
    lines.append("Runs not done: " + (", ".join(f"`{r['run']}` ({_progress(r, logged.get(r['run']))})"
                                                for _, r in unfinished.iterrows()) or "none") + ".")
    no_eval = c[~c["eval_files"]]["run"]
    lines.append("Runs without evaluation files (eval/*.json): "
                 + (", ".join(f"`{r}`" for r in no_eval) or "none") + ".")
    no_score = sorted(set(c["run"]) - set(runs.metrics.loc[runs.metrics["metric"] == tag, "run"]))
    lines.append(f"Runs without `{tag}`: " + (", ".join(f"`{r}`" for r in no_score) or "none") + ".")
    lines.append("Curves and thresholds use the steps every seed of an architecture has reached; final values are "
                 "each run's last logged value.\n")
    return "\n\n".join(lines)


def _progress(run: pd.Series, logged: float | None) -> str:
    """State and the last step logged (status.json holds the step a running run started from)."""
    if logged is None or pd.isna(logged):
        return run["state"]
    return f"{run['state']}, logged up to step {int(logged)} of {run['train.max_steps']}"


def _emergence(runs: Runs, out: Path, metric: str, tag: str) -> str:
    curve = tables.curves(runs.metrics, tag)
    thresholds = tables.thresholds(curve)
    _write(curve, out, "emergence_curves.csv")
    _write(thresholds, out, "emergence_thresholds.csv")
    text = ["## 1. Emergence\n", "Long-context score against training tokens, one curve per "
            "architecture. `tokens_50`/`tokens_90`: tokens at which the seed-mean curve first reaches 50% / 90% of its "
            "final value (the first evaluation at or above it; empty where the final value is not above 0); from the "
            "mean curve, with no interval: finding 1 of `findings.md` (`analyze --findings`) compares the speeds with "
            "their 95% CIs.\n"]
    if curve.empty:
        return "\n".join(text + [f"No run has logged `{tag}` yet.\n"])
    noise = tables.noise_levels(runs.metrics, SIGNAL_Z) if tag == SCORE else None
    figures.save(figures.emergence(curve, METRIC_AXIS[metric], noise, SIGNAL_Z), out / "emergence.png")
    text += ["![emergence](emergence.png)\n", _md(thresholds), "\nCSV: `emergence_curves.csv`, "
             "`emergence_thresholds.csv`.\n"]
    longppl = tables.curves(runs.metrics, Tag.LONGPPL)
    if not longppl.empty:  # the paper's measure of finding 1 (runs with a LongPPL evaluator)
        _write(longppl, out, "longppl_curves.csv")
        figures.save(figures.longppl(longppl), out / "longppl.png")
        text += ["LongPPL (Fang et al. 2024: perplexity on the key tokens that one evaluator model chose; "
                 "docs/evaluation.md) against training tokens, the paper's measure of how fast long-context ability "
                 "emerges.\n", "![longppl](longppl.png)\n", "CSV: `longppl_curves.csv`.\n"]
    return "\n".join(text)


def _laziness(runs: Runs, out: Path) -> str:
    head_curves = {t: tables.curves(runs.metrics, t) for t in ("heads/retrieval_heads", "heads/max_score")}
    first = tables.first_heads(runs.metrics, runs.configs)
    by_arch = tables.first_heads_by_arch(first)
    _write(pd.concat([c.assign(metric=t) for t, c in head_curves.items()], ignore_index=True), out, "head_curves.csv")
    _write(first, out, "first_heads.csv")
    _write(by_arch, out, "first_heads_by_arch.csv")
    text = ["## 2. Laziness: retrieval heads by SWA window\n",
            "Retrieval heads (score above the run's `eval.heads.threshold`) and the highest head score against "
            "training tokens. First retrieval head: the first scored step from which every scoring has at least one; "
            "means over the seeds that have one (`runs_with_head` of `runs`), with a 95% t interval of the mean "
            "where every seed has one.\n"]
    if first.empty:
        return "\n".join(text + ["No run has retrieval-head scores (eval/heads_step_<k>.json) yet.\n"])
    threshold = _head_threshold(runs)
    fig = figures.laziness(head_curves, threshold)
    figures.save(fig, out / "laziness.png")
    return "\n".join(text + ["![laziness](laziness.png)\n", _md(by_arch), "\nPer run:\n", _md(first),
                             "\nCSV: `head_curves.csv`, `first_heads.csv`, `first_heads_by_arch.csv`.\n"])


def _head_threshold(runs: Runs) -> float | None:
    """The runs' ``eval.heads.threshold`` when they share one."""
    values = runs.configs.get("eval.heads.threshold", pd.Series(dtype=float)).dropna().unique()
    return float(values[0]) if len(values) == 1 else None


def _niah(runs: Runs, out: Path, metric: str) -> str:
    cells = tables.niah(runs.records, runs.configs, metric)
    _write(cells, out, "niah.csv")
    used = record_metric(metric)
    text = ["## 3. Needle depth x length, last evaluation of each run\n",
            f"Cell value: `{used}`, {METRIC_AXIS[used]}, over the samples of the cell.\n"]
    if cells.empty:
        return "\n".join(text + ["No run has long-context records (eval/step_<k>.json) yet.\n"])
    for run, c in cells.groupby("run", sort=True):
        name = f"niah/{figures.file_name(run)}.png"
        title = f"{run}: {c['label'].iloc[0]}, step {c['step'].iloc[0]}"
        figures.save(figures.niah_heatmap(c, title, METRIC_AXIS[used]), out / name)
        text.append(f"![{run}]({name})\n")
    return "\n".join(text + ["CSV: `niah.csv`.\n"])


def _pos(runs: Runs, out: Path, metric: str, summary: pd.DataFrame) -> str:
    pairs = pd.concat([tables.pos_pairs(summary, runs.configs, key) for key in POS_KEYS], ignore_index=True)
    _write(pairs, out, "nope_vs_rope.csv")
    text = ["## 4. NoPE vs RoPE\n",
            f"Architectures differing only in the positional encoding of the full-attention layers (`model.pos.full`) "
            f"or of the efficient layers (`model.pos.efficient`): long-context score beyond the training length "
            f"(`{record_metric(metric)}` over probe lengths > `train.seq_len`) and short-context "
            "validation loss (`val/loss`, nats per token), final values, mean over the seeds counted in `seeds_*`; "
            "delta = NoPE - RoPE, a difference of means with no interval: the verdict with its 95% CI and p is "
            "finding 3 of `findings.md` (`analyze --findings`).\n"]
    if pairs.empty:
        return "\n".join(text + ["No such pair of architectures among the runs.\n"])
    return "\n".join(text + [_md(pairs), "\nCSV: `nope_vs_rope.csv`.\n"])


def _head_maps(runs: Runs, out: Path) -> str:
    maps = tables.head_maps(runs.heads, runs.layers, runs.configs)
    _write(maps, out, "head_maps.csv")
    text = ["## 5. Retrieval-score maps\n"]
    if maps.empty:
        return "\n".join(text + ["No run has retrieval-head scores yet.\n"])
    figures.save(figures.head_maps(maps, _head_threshold(runs) or 0.1), out / "head_maps.png")
    return "\n".join(text + ["![head maps](head_maps.png)\n", "CSV: `head_maps.csv`.\n"])


def _ablation(runs: Runs, out: Path) -> str:
    draws = tables.ablation(runs.ablations, runs.configs)
    summary = tables.ablation_summary(draws)
    _write(draws, out, "ablation.csv")
    _write(summary, out, "ablation_summary.csv")
    text = ["## 6. Head ablations\n",
            "Probe answer-token accuracy with the chosen heads' outputs set to 0 "
            "(`hybrid-lightning heads --mask-top K`, "
            "`--mask-random K`, `--mask`), pooled over tasks; `token_drop` = unmasked - masked, mean (min, max) over "
            "the draws; `exact_drop`: the same for exact match; `within`: probe length <= `train.seq_len`.\n"]
    if summary.empty:
        return "\n".join(text + ["No run has a head ablation yet.\n"])
    shown = summary.drop(columns=["label"])
    return "\n".join(text + [_md(shown),
                             "\nCSV: `ablation.csv` (one row per draw and length), `ablation_summary.csv`.\n"])


def _summary(summary: pd.DataFrame, out: Path) -> str:
    _write(summary, out, "summary.csv")
    return "\n".join(["## 7. Architectures and budgets\n",
                      "Final values, mean over seeds: `val_loss` (nats per token), `score` (the long-context score, "
                      "with its min-max over seeds), `score_beyond` (lengths > `train.seq_len`), retrieval heads and "
                      "the highest head score; `seeds`: the runs averaged (only `score` carries a spread, its min-max; "
                      "no interval is computed here); `budget_tokens` = `train.max_steps` x tokens per step; `step`: "
                      "the fewest steps a seed has logged.\n", _md(summary), "\nCSV: `summary.csv`.\n"])


def _write(table: pd.DataFrame, out: Path, name: str) -> None:
    table.to_csv(out / name, index=False)


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.0f}" if v.is_integer() and abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


def _md(table: pd.DataFrame) -> str:
    """A markdown table (numbers to 4 significant digits)."""
    head = "| " + " | ".join(map(str, table.columns)) + " |"
    rule = "|" + "---|" * len(table.columns)
    rows = ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([head, rule, *rows])
