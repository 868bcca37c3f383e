"""The tables ``grid plan`` and ``grid status`` print, and their JSON forms."""

from __future__ import annotations

from collections import Counter

from hybrid_lightning.grid.spec import Grid, format_value, load_grid
from hybrid_lightning.grid.state import CellState, cell_states
from hybrid_lightning.units import format_table, si


def plan_rows(grid: Grid, throughput: float | None = None, tflops: float | None = None) -> list[dict]:
    """One dict per cell, from its run plan: name, axis labels, overrides, run directory, parameters, tokens, the
    estimated peak memory per device (bytes, with the cell's and the other activation checkpointing setting, and
    its parts), GPU-hours.

    Args:
        grid: the expanded grid.
        throughput: training tokens per second per GPU, for the GPU-hour estimate of every cell.
        tflops: sustained training TFLOP/s per GPU, for a GPU-hour estimate from each cell's FLOPs per token
            (the plan's): cells of different sizes get their own.
    """
    from hybrid_lightning.plan.memory import MemoryEstimate

    rows = []
    for cell in grid.cells:
        plan = cell.plan
        tokens, memory = plan.budget.tokens, MemoryEstimate(**plan.memory)
        row = {
            "name": cell.name, "axes": cell.labels, "overrides": cell.overrides, "run_dir": str(cell.run_dir),
            "non_embedding_params": plan.params["non_embedding"], "tokens": tokens,
            "peak_memory": memory.peak(), "peak_memory_other_checkpointing": memory.peak(not memory.checkpointing),
            "memory": dict(plan.memory),
        }
        if throughput:
            row["gpu_hours"] = tokens / throughput / 3600
        elif tflops:
            row["gpu_hours"] = plan.flops_per_token * tokens / (tflops * 1e12) / 3600
        rows.append(row)
    return rows


def planned_cells(path, root=None) -> list[tuple]:
    """A grid's cells as the design check (``grid plan --verdicts``, analysis/design.py) reads them: (name,
    config as plain data, run plan), planned without their data, which need not exist before the grid runs."""
    from hybrid_lightning.config import config_to_dict
    from hybrid_lightning.plan.resolve import plan_run

    planned = [(cell.name, plan_run(cell.config, sources=False)) for cell in load_grid(path, root, resolve=False).cells]
    return [(name, config_to_dict(cfg), plan) for name, (cfg, plan) in planned]


def plan_table(grid: Grid, rows: list[dict]) -> str:
    axes = list(grid.axes)
    from hybrid_lightning.plan.memory import gib

    header = ["cell", *axes, "non-emb params", "tokens", "memory", "other ckpt"] + (["GPU-h"] if rows and "gpu_hours" in rows[0] else [])
    table = [header]
    for row in rows:
        line = [row["name"], *(format_value(row["axes"][a]) for a in axes), si(row["non_embedding_params"]), si(row["tokens"]),
                gib(row["peak_memory"]), gib(row["peak_memory_other_checkpointing"])]
        if "gpu_hours" in row:
            line.append(f"{row['gpu_hours']:.3g}")
        table.append(line)
    total = sum(r["tokens"] for r in rows)
    footer = f"{len(rows)} cells, {si(total)} tokens" + (
        f", {sum(r['gpu_hours'] for r in rows):.3g} GPU-hours" if rows and "gpu_hours" in rows[0] else ""
    )
    return (f"{format_table(table)}\n{footer}; run directories in {grid.root}\nmemory: estimated peak per device "
            "(plan/memory.py); other ckpt: the same with train.activation_checkpointing switched")


def dry_run_table(grid: Grid) -> str:
    """What ``grid submit`` would train: each cell it would submit with its steps, tokens and time
    (``training.dryrun``: a throughput measured here per distinct model), and the total."""
    from hybrid_lightning.grid.submit import unfinished
    from hybrid_lightning.training.dryrun import duration, estimate

    todo = unfinished(grid, cell_states(grid))
    table, total = [["cell", "state", "steps", "tokens", "tokens/s", "time"]], 0.0
    for cell, state in todo:
        est = estimate(cell.config, cell.plan)
        total += est.seconds
        table.append([cell.name, state.state, f"{est.steps:,}", si(est.tokens), f"{est.tokens_per_s:,.0f}", duration(est.seconds)])
    return (f"{format_table(table, left=(0, 1))}\n{len(todo)} of {len(grid.cells)} cells to submit, about "
            f"{duration(total)} of training one after another (throughput measured here; evaluations not counted); nothing written")


def status_table(rows: list[CellState]) -> str:
    # score, beyond: the last val_longctx/score (lengths up to train.seq_len) and val_longctx/score_beyond (longer ones)
    table = [["cell", "state", "step", "loss", "score", "beyond", "job", "log"]]
    for r in rows:
        table.append([
            r.name, r.state, f"{r.step or 0}/{r.max_steps}", *("-" if v is None else f"{v:.3f}" for v in (r.loss, r.longctx,
                                                                                                        r.longctx_beyond)),
            r.job_id or "-", r.log or "-",
        ])
    counts = Counter(r.state for r in rows)
    lines = [format_table(table, left=(0, 1, 6, 7)), f"{len(rows)} cells: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
    lines += [f"{r.state} {r.name}: {r.reason}" for r in rows if r.reason and r.state in ("failed", "cancelled", "incomplete")]
    return "\n".join(lines)
