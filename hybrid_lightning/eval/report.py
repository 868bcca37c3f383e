"""Reports of long-context evaluations: pooled figures, TensorBoard scalars, the depth x length
heatmap, a printed table, and the ``eval/step_<k>.json`` files (format in docs/run-directory.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hybrid_lightning.records import LONGCTX_TAGS, TASKS_TAGS, Tag, pool
from hybrid_lightning.records import headline as cells_headline
from hybrid_lightning.rundir import eval_path
from hybrid_lightning.rundir.evals import write_eval_record

CARD_PX = 340  # the width of an image card in TensorBoard's Images dashboard (2.21, seen in a browser), in pixels
CARD_DPI = 100  # a figure's dots per inch there: 8-point labels are 11 pixels high
# Record field -> the generation statistic (scoring.STATS) it averages over the cell's generated samples.
GENERATION_FIELDS = {"generated_exact": "gen_exact", "match_all": "match_all", "match_part": "match_part"}
# Fields that identify a row of each list in a report; a newer row replaces an older one with the same key.
ROW_KEYS = {
    "records": ("task", "length", "depth", "in_window"),
    "position_loss": ("length", "position_lo"),
    "longppl": ("length", "context", "alpha", "beta"),
}


def headline(report: dict) -> dict[str, float | None]:
    """The report's summary figures (``records.headline`` of its cells at its training length)."""
    return cells_headline(report["records"], report.get("seq_len"))


def scalars(report: dict) -> dict[str, float]:
    """TensorBoard scalars of a report, tag -> value: the headline (``records.headline``) and LongPPL under
    ``LONGCTX_TAGS``, the detail per task and per position under ``TASKS_TAGS``."""
    out: dict[str, float] = {}
    records = report["records"]
    for task in dict.fromkeys(r["task"] for r in records):
        for length in sorted({r["length"] for r in records if r["task"] == task}):
            out[f"{TASKS_TAGS}/{task}/len_{length}"] = pool(records, task=task, length=length)["score"]
        p = pool(records, task=task)
        out[f"{TASKS_TAGS}/{task}/exact"] = p["accuracy"]
        out.update({f"{TASKS_TAGS}/{task}/{k}": p[k] for k in ("match_all", "match_part") if p[k] is not None})
        out[f"{TASKS_TAGS}/{task}/chance_token_accuracy"], out[f"{TASKS_TAGS}/{task}/chance_loss"] = (
            p["chance_token_accuracy"], p["chance_loss"])
        splits = ({"": {}} if report["window"] is None
                  else {"_in_window": {"in_window": True}, "_out_window": {"in_window": False}})
        for suffix, where in splits.items():
            p = pool(records, task=task, **where)
            if p is not None:
                out[f"{TASKS_TAGS}/{task}/token_accuracy{suffix}"], out[f"{TASKS_TAGS}/{task}/answer_loss{suffix}"] = (
                    p["token_accuracy"], p["answer_loss"])
    out.update({f"{LONGCTX_TAGS}/{k}": v for k, v in headline(report).items() if v is not None})  # Tag.SCORE, ...
    for row in report["position_loss"]:
        out[f"{TASKS_TAGS}/position_loss/{row['position_lo']:06d}-{row['position_hi'] - 1:06d}"] = row["loss"]
    for row in report["longppl"]:
        if row["longppl"] is not None:
            out[Tag.LONGPPL] = row["longppl"]
        if row["key_tokens"] is not None:
            out[f"{LONGCTX_TAGS}/key_token_share"] = row["key_tokens"] / row["scored_tokens"]
        out[f"{LONGCTX_TAGS}/ppl_long"] = row["ppl"]
    return out


def card_figure(height: float):
    """A matplotlib figure as wide as an image card of TensorBoard's Images dashboard (``CARD_PX``), which shows an
    image at its own size, ``height`` inches tall: its fonts then show at their point size."""
    from matplotlib.figure import Figure

    return Figure(figsize=(CARD_PX / CARD_DPI, height), dpi=CARD_DPI, layout="constrained")


def colour_limits(values: np.ndarray, floor: float | None = None, span: float = 0.1) -> tuple[float, float]:
    """A heatmap's colour scale that follows its cells: from their lowest (or ``floor``) to their highest, at least
    ``span`` wide, so that cells near 0, or below it (a score under chance), do not all take one end of a 0-1 bar."""
    finite = values[np.isfinite(values)]
    lo = floor if floor is not None else float(finite.min(initial=0.0))
    return lo, max(float(finite.max(initial=lo)), lo + span)


def heatmap(report: dict):
    """A matplotlib figure for TensorBoard: per task (one row each), the score (answer-token accuracy above chance)
    by needle depth (rows) and length (columns), each cell's value printed, and the colour bar."""
    records = report["records"]
    tasks = list(dict.fromkeys(r["task"] for r in records))
    fig = card_figure(0.6 + 1.3 * len(tasks))
    axes = np.atleast_1d(fig.subplots(max(1, len(tasks)), 1))
    grids = {}  # task -> (lengths, depths, depth x length scores)
    for task in tasks:
        lengths = sorted({r["length"] for r in records if r["task"] == task})
        depths = sorted({r["depth"] for r in records if r["task"] == task})
        grids[task] = lengths, depths, np.array([[pool(records, task=task, length=n, depth=d)["score"]
                                                  for n in lengths] for d in depths], dtype=float)
    lo, hi = colour_limits(np.concatenate([g.ravel() for *_, g in grids.values()] or [np.zeros(0)]))
    for ax, task in zip(axes, tasks):
        lengths, depths, grid = grids[task]
        image = ax.imshow(grid, vmin=lo, vmax=hi, cmap="viridis", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="white" if v < lo + 0.6 * (hi - lo) else "black",
                    fontsize=8)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=8)
        ax.set_ylabel("needle depth", fontsize=8)
        ax.set_title(task, fontsize=9)
    axes[-1].set_xlabel("length (tokens)", fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.9).ax.tick_params(labelsize=8)
    fig.suptitle(f"score (token accuracy above chance), step {report['step']}", fontsize=9)
    return fig


def table(report: dict) -> str:
    """A plain-text table: per task and length, the score, exact match, graded measures against
    chance and RULER's generation score."""
    lines = [f"step {report['step']}  tokens {report['tokens']:,}  window {report['window']}",
             f"{'task':<18}{'length':>8}{'n':>5}{'score':>8}{'exact':>8}{'token acc (chance)':>21}{'loss (chance)':>17}"
             f"{'match_all':>11}"]
    records = report["records"]
    for task in dict.fromkeys(r["task"] for r in records):
        for length in sorted({r["length"] for r in records if r["task"] == task}):
            p = pool(records, task=task, length=length)
            match = "-" if p["match_all"] is None else f"{p['match_all']:.3f}"
            lines.append(f"{task:<18}{length:>8}{p['n']:>5}{p['score']:>8.3f}{p['accuracy']:>8.3f}"
                         f"{p['token_accuracy']:>12.3f} ({p['chance_token_accuracy']:.3f}){p['answer_loss']:>10.3f} "
                         f"({p['chance_loss']:.3f}){match:>11}")
    h = headline(report)
    if h["score"] is not None:
        beyond = "" if h["score_beyond"] is None else f", beyond the training length {h['score_beyond']:.3f}"
        lines.append("score (answer-token accuracy above chance) " + f"{h['score']:.3f}{beyond}, exact match "
                     f"{h['exact']:.3f}"
                     + ("" if h["match_all"] is None else f", generation string_match_all {h['match_all']:.3f}"
                        f" / string_match_part {h['match_part']:.3f}"))
    if report["position_loss"]:
        lines.append("loss by position: "
                     + "  ".join(f"{r['position_lo']}+: {r['loss']:.3f}" for r in report["position_loss"]))
    for r in report["longppl"]:
        if r.get("key_tokens") is None:
            lines.append(f"LongPPL not reported: {r.get('reason')}; perplexity {r['ppl']:.3f}")
        else:
            longppl = "n/a" if r["longppl"] is None else f"{r['longppl']:.3f}"
            lines.append(f"LongPPL {longppl} over {r['key_tokens']} key tokens of {r['scored_tokens']} "
                         f"(context {r['context']}, evaluator {r.get('evaluator')}); perplexity {r['ppl']:.3f}")
    return "\n".join(lines)


def report_path(run_dir: Path, step: int) -> Path:
    return eval_path(run_dir, "longctx", step)


def write_report(run_dir: Path, report: dict) -> Path:
    """Writes (or merges into) ``eval/step_<step>.json``: rows of an existing file that the new
    report does not cover are kept, the others replaced; the headline scores are those of the merged rows."""
    return write_eval_record(run_dir, "longctx", report, ROW_KEYS, headline)
