"""Reports of retrieval-head scores (retrieval.py) and head ablations (ablation.py): TensorBoard scalars,
the layer x head score image, printed tables and the ``eval/heads_step_<k>.json`` files (format in
docs/run-directory.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hybrid_lightning.eval.report import card_figure, colour_limits
from hybrid_lightning.records import ABLATION_KEY, HEADS_TAGS
from hybrid_lightning.rundir import eval_path
from hybrid_lightning.rundir.evals import write_eval_record

MEASURES = ("retrieval_heads", "copy_heads", "locator_heads", "max_score", "mean_score")
# Fields that identify an ablation test (the rows' key is records.ABLATION_KEY); a newer one replaces an older one
# with the same key.
TEST_KEY = ("k", "mode", "masked", "seed", "match", "draws", "selection_seed")
ANNOTATE_HEADS = 4  # the image prints each score where a layer has at most this many heads (a card is 340 pixels wide)


def head_name(layer: int, head: int) -> str:
    return f"{layer}.{head}"


def layer_label(row: dict) -> str:
    mixer = f"{row['mixer']}/{row['window']}" if row["window"] is not None else row["mixer"]
    return f"{row['layer']} {mixer}" + ("" if row["applicable"] else " (n/a)")


def scored_layers(report: dict) -> set[int]:
    """The attention layers of which some head scored above 0."""
    return {layer["layer"] for layer in report["layers"] if layer["applicable"] and (layer["max_score"] or 0) > 0}


def heads_scalars(report: dict, layers: set[int] = frozenset()) -> dict[str, float]:
    """TensorBoard scalars, tag -> value: totals under ``val_longctx_heads/``, the probes' exact match and token
    accuracy, and the measures of each of ``layers`` (those whose heads have scored, at this evaluation or an
    earlier one: the others' would be cards of zeros) under ``val_longctx_heads/layer_<ll>/``."""
    out = {f"{HEADS_TAGS}/{k}": float(v) for k, v in report["total"].items() if v is not None}
    for layer in report["layers"]:
        if layer["applicable"] and layer["layer"] in layers:
            out |= {f"{HEADS_TAGS}/layer_{layer['layer']:02d}/{k}": float(layer[k])
                    for k in MEASURES if layer[k] is not None}
    for k in ("accuracy", "token_accuracy"):
        if report[k] is not None:
            out[f"{HEADS_TAGS}/probe_{k}"] = report[k]
    return out


def score_grid(report: dict) -> np.ndarray:
    """(layers, heads) retrieval scores; NaN where a layer is not attention or nothing was scored."""
    n_heads = 1 + max((r["head"] for r in report["heads"]), default=0)
    grid = np.full((len(report["layers"]), n_heads), np.nan)
    for r in report["heads"]:
        if r["score"] is not None:
            grid[r["layer"], r["head"]] = r["score"]
    return grid


def score_image(report: dict):
    """A matplotlib figure for TensorBoard: retrieval score by layer (rows) and head (columns) with its colour bar;
    grey = not scored; each score printed, C = copy head, L = locator head, where the cells are wide enough."""
    import matplotlib

    grid = score_grid(report)
    roles = {(r["layer"], r["head"]): r["role"] for r in report["heads"]}
    n_layers, n_heads = grid.shape
    fig = card_figure(0.9 + 0.22 * n_layers)
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")
    lo, hi = colour_limits(grid, floor=0.0)
    image = ax.imshow(np.ma.masked_invalid(grid), vmin=lo, vmax=hi, cmap=cmap, aspect="auto")
    if n_heads <= ANNOTATE_HEADS:
        for (i, j), v in np.ndenumerate(grid):
            mark = {"copy": "C", "locator": "L"}.get(roles.get((i, j)), "")
            text = "n/a" if np.isnan(v) else f"{v:.2f}{mark}"
            ax.text(j, i, text, ha="center", va="center", color="white" if v < 0.6 * hi else "black", fontsize=7)
    ax.set_xticks(range(n_heads), [str(h) for h in range(n_heads)], fontsize=7)
    ax.set_yticks(range(n_layers), [layer_label(r) for r in report["layers"]], fontsize=7)
    ax.set_xlabel("head", fontsize=8)
    ax.set_ylabel("layer", fontsize=8)
    fig.colorbar(image, ax=ax, shrink=0.9).ax.tick_params(labelsize=7)
    ax.set_title(f"retrieval score, step {report['step']}"
                 + (" (C copy, L locator)" if n_heads <= ANNOTATE_HEADS else ""), fontsize=8)
    return fig


def _num(v, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def heads_table(report: dict, top: int = 5) -> str:
    """Plain text: the probes, the score grid (``*`` retrieval head, C copy, L locator), totals and
    the ``top`` heads by score with their copy/locate records."""
    s, t = report["settings"], report["total"]
    lines = [f"step {report['step']}  tokens {report['tokens']:,}  probes {report['samples']} (scored "
             f"{report['kept']})  exact {_num(report['accuracy'])}  token acc {_num(report['token_accuracy'])}",
             f"retrieval score by layer and head (* above {s['threshold']:g}; C copy, L locator):"]
    grid = score_grid(report)
    cells = {(r["layer"], r["head"]): r for r in report["heads"]}
    label_width = max(len(layer_label(r)) for r in report["layers"])
    lines.append(" " * label_width + "".join(f"{h:>9}" for h in range(grid.shape[1])))
    for layer in report["layers"]:
        row = layer_label(layer).ljust(label_width)
        for h in range(grid.shape[1]):
            r = cells.get((layer["layer"], h))
            if r is None or r["score"] is None:
                row += f"{'-':>9}"
            else:
                mark = ("*" if r["retrieval"] else "") + {"copy": "C", "locator": "L"}.get(r["role"], "")
                row += f"{r['score']:>7.3f}{mark:<2}"
        lines.append(row)
    lines.append(f"retrieval heads {t['retrieval_heads']} (copy {t['copy_heads']}, locator {t['locator_heads']}) of "
                 f"{len(report['heads'])} attention heads; max score {_num(t['max_score'])}, mean "
                 f"{_num(t['mean_score'])}")
    lines.append(f"heads that could reach a copy source (inside their window): {t['reaching_heads']}, of which above "
                 f"the threshold there: {t['reach_retrieval_heads']}")
    ranked = sorted((r for r in report["heads"] if r["score"] is not None), key=lambda r: -r["score"])[:top]
    if ranked:
        lines.append("top heads:  score  token score  in-span  copy precision  span mass  source mass  role")
        for r in ranked:
            lines.append(f"{head_name(r['layer'], r['head']):>9}  {r['score']:.3f}  {r['token_score']:11.3f}  "
                         f"{r['in_span']:7.3f}  {_num(r['copy_precision']):>14}  {r['span_mass']:9.3f}  "
                         f"{r['source_mass']:11.3f}  {r['role'] or '-'}")
    return "\n".join(lines)


def ablation_table(report: dict) -> str:
    """Plain text: the masked heads and, per task and length, the NIAH measures before -> after."""
    rows = report["ablation"]
    first = rows[0]
    what = {"top": f"top-{first['k']} heads by score", "random": f"{first['k']} random heads (seed {first['seed']})",
            "list": "the listed heads"}[first["selection"]]
    lines = [f"ablation: mask {what}: " + " ".join(head_name(*h) for h in first["masked"]),
             f"{'task':<18}{'length':>8}{'n':>5}{'exact (change)':>28}{'token acc (chance)':>27}{'answer loss':>20}"]
    for r in rows:
        lines.append(f"{r['task']:<18}{r['length']:>8}{r['n']:>5}{r['accuracy']:>9.3f} -> {r['masked_accuracy']:.3f} "
                     f"({r['masked_accuracy'] - r['accuracy']:+.3f}){r['token_accuracy']:>10.3f} -> "
                     f"{r['masked_token_accuracy']:.3f} ({r['chance_token_accuracy']:.3f}){r['answer_loss']:>10.3f} -> "
                     f"{r['masked_answer_loss']:.3f}")
    base = sum(r["accuracy"] for r in rows) / len(rows)
    masked = sum(r["masked_accuracy"] for r in rows) / len(rows)
    lines.append(f"score {base:.3f} -> {masked:.3f} (drop {base - masked:.3f})")
    return "\n".join(lines)


def control_table(test: dict) -> str:
    """Plain text: an ablation test, the top K against random draws (layer-matched, or of non-retrieval heads)."""
    harms = test["draw_harms"]
    against = {"layer": "from the same layers", "non-retrieval": "of non-retrieval heads"}[test["match"]]
    return (f"top-{test['k']} ({' '.join(head_name(*h) for h in test['masked'])}, chosen on probe seed "
            f"{test['selection_seed']}) vs {test['draws']} random draws {against}, masked {test.get('mode', 'zero')}: "
            f"token accuracy drop {test['harm']:.3f} vs {min(harms):.3f}-{max(harms):.3f} (mean "
            f"{sum(harms) / len(harms):.3f}); permutation p = {test['p']:.3f}")


def single_table(report: dict) -> str:
    """Plain text: the token accuracy drop of masking each attention head alone, pooled over the probes."""
    from hybrid_lightning.heads.ablation import harm

    by_head: dict[str, list[dict]] = {}
    for r in report["ablation"]:
        if r["selection"] == "single":
            by_head.setdefault(head_name(*r["masked"][0]), []).append(r)
    return "single-head ablation, token accuracy drop: " + "  ".join(
        f"{h} {harm(rows):+.3f}" for h, rows in by_head.items())


def heads_path(run_dir: Path, step: int) -> Path:
    return eval_path(run_dir, "heads", step)


def write_heads(run_dir: Path, report: dict) -> Path:
    """Writes ``eval/heads_step_<step>.json``: the report's scores replace the file's; ablation rows
    of the file that the report does not replace are kept."""
    return write_eval_record(run_dir, "heads", report, {"ablation": ABLATION_KEY, "ablation_tests": TEST_KEY})
