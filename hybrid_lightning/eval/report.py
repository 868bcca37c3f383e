"""Reports of long-context evaluations: pooled figures, TensorBoard scalars, the depth x length
heatmap, a printed table, and the ``eval/step_<k>.json`` files (format in README.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from hybrid_lightning.rundir import EVAL_DIR, write_atomic

# Fields that identify a row of each list in a report; a newer row replaces an older one with the same key.
ROW_KEYS = {
    "records": ("task", "length", "depth", "in_window"),
    "position_loss": ("length", "position_lo"),
    "longppl": ("length", "context", "alpha", "beta"),
}


def pool(records: list[dict], **where) -> dict | None:
    """Pooled figures of the records matching ``where`` (e.g. task=..., in_window=True), weighting
    samples for accuracy and answer tokens for the token measures; None if none match."""
    rows = [r for r in records if all(r[k] == v for k, v in where.items())]
    if not rows:
        return None
    n = sum(r["n"] for r in rows)
    tok = sum(r["answer_tokens"] for r in rows)
    chance_loss = sum(r["chance_loss"] * r["answer_tokens"] for r in rows) / tok
    return {
        "n": n, "accuracy": sum(r["accuracy"] * r["n"] for r in rows) / n,
        "token_accuracy": sum(r["token_accuracy"] * r["answer_tokens"] for r in rows) / tok,
        "answer_loss": sum(r["answer_loss"] * r["answer_tokens"] for r in rows) / tok,
        "chance_token_accuracy": math.exp(-chance_loss), "chance_loss": chance_loss,
    }


def score(report: dict) -> float | None:
    """``longctx/score``: exact-match accuracy averaged over (task, length), each pooled over depths."""
    cells = {(r["task"], r["length"]) for r in report["records"]}
    accs = [pool(report["records"], task=t, length=n)["accuracy"] for t, n in sorted(cells)]
    return sum(accs) / len(accs) if accs else None


def scalars(report: dict) -> dict[str, float]:
    """TensorBoard scalars of a report, tag -> value."""
    out: dict[str, float] = {}
    records = report["records"]
    for task in dict.fromkeys(r["task"] for r in records):
        for length in sorted({r["length"] for r in records if r["task"] == task}):
            out[f"longctx/{task}/len_{length}"] = pool(records, task=task, length=length)["accuracy"]
        p = pool(records, task=task)
        out[f"longctx/{task}/chance_token_acc"], out[f"longctx/{task}/chance_loss"] = p["chance_token_accuracy"], p["chance_loss"]
        splits = {"": {}} if report["window"] is None else {"_in_window": {"in_window": True}, "_out_window": {"in_window": False}}
        for suffix, where in splits.items():
            p = pool(records, task=task, **where)
            if p is not None:
                out[f"longctx/{task}/token_acc{suffix}"], out[f"longctx/{task}/answer_loss{suffix}"] = p["token_accuracy"], p["answer_loss"]
    if score(report) is not None:
        out["longctx/score"] = score(report)
    for row in report["position_loss"]:
        out[f"longctx/position_loss/{row['position_lo']:06d}-{row['position_hi'] - 1:06d}"] = row["loss"]
    for row in report["longppl"]:
        if row["longppl"] is not None:
            out["longctx/longppl"] = row["longppl"]
        if row["key_tokens"] is not None:
            out["longctx/key_token_share"] = row["key_tokens"] / row["scored_tokens"]
        out["longctx/ppl_long"] = row["ppl"]
    return out


def heatmap(report: dict):
    """A matplotlib figure: per task, exact-match accuracy by needle depth (rows) and length (columns)."""
    from matplotlib.figure import Figure

    records = report["records"]
    tasks = list(dict.fromkeys(r["task"] for r in records))
    fig = Figure(figsize=(2.2 + 2.0 * len(tasks), 3.2), layout="constrained")
    for ax, task in zip(np.atleast_1d(fig.subplots(1, max(1, len(tasks)))), tasks):
        lengths = sorted({r["length"] for r in records if r["task"] == task})
        depths = sorted({r["depth"] for r in records if r["task"] == task})
        acc = np.array([[pool(records, task=task, length=n, depth=d)["accuracy"] for n in lengths] for d in depths])
        ax.imshow(acc, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        for (i, j), v in np.ndenumerate(acc):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=8)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_xlabel("length (tokens)", fontsize=8)
        ax.set_ylabel("needle depth", fontsize=8)
        ax.set_title(task, fontsize=9)
    fig.suptitle(f"exact-match accuracy, step {report['step']}", fontsize=9)
    return fig


def table(report: dict) -> str:
    """A plain-text table: per task and length, accuracy and graded measures against chance."""
    lines = [f"step {report['step']}  tokens {report['tokens']:,}  window {report['window']}",
             f"{'task':<18}{'length':>8}{'n':>5}{'exact':>8}{'token acc (chance)':>21}{'loss (chance)':>17}"]
    records = report["records"]
    for task in dict.fromkeys(r["task"] for r in records):
        for length in sorted({r["length"] for r in records if r["task"] == task}):
            p = pool(records, task=task, length=length)
            lines.append(f"{task:<18}{length:>8}{p['n']:>5}{p['accuracy']:>8.3f}"
                         f"{p['token_accuracy']:>12.3f} ({p['chance_token_accuracy']:.3f}){p['answer_loss']:>10.3f} ({p['chance_loss']:.3f})")
    if score(report) is not None:
        lines.append(f"score {score(report):.3f}")
    if report["position_loss"]:
        lines.append("loss by position: " + "  ".join(f"{r['position_lo']}+: {r['loss']:.3f}" for r in report["position_loss"]))
    for r in report["longppl"]:
        if r.get("key_tokens") is None:
            lines.append(f"LongPPL not reported: {r.get('reason')}; perplexity {r['ppl']:.3f}")
        else:
            longppl = "n/a" if r["longppl"] is None else f"{r['longppl']:.3f}"
            lines.append(f"LongPPL {longppl} over {r['key_tokens']} key tokens of {r['scored_tokens']} "
                         f"(context {r['context']}, evaluator {r.get('evaluator')}); perplexity {r['ppl']:.3f}")
    return "\n".join(lines)


def report_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / EVAL_DIR / f"step_{step}.json"


def write_report(run_dir: Path, report: dict) -> Path:
    """Writes (or merges into) ``eval/step_<step>.json``: rows of an existing file that the new
    report does not cover are kept, the others replaced."""
    path = report_path(run_dir, report["step"])
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = dict(report)
    if path.is_file():
        old = json.loads(path.read_text())
        for name, keys in ROW_KEYS.items():
            new = {tuple(r[k] for k in keys) for r in report[name]}
            merged[name] = [r for r in old.get(name, []) if tuple(r[k] for k in keys) not in new] + report[name]
    merged["score"] = score(merged)
    write_atomic(path, json.dumps(merged, indent=1))
    return path
