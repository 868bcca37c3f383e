"""The tables ``grid plan`` and ``grid status`` print, and their JSON forms."""

from __future__ import annotations

import json
from collections import Counter

from hybrid_lightning.grid.branches import branch_steps
from hybrid_lightning.grid.capacity import DEFAULT_GPU, Gpu
from hybrid_lightning.grid.spec import Grid, format_value
from hybrid_lightning.grid.state import CellState, cell_states
from hybrid_lightning.runplan import gib
from hybrid_lightning.units import figure, format_table, si


def plan_rows(grid: Grid, gpu: Gpu = DEFAULT_GPU) -> list[dict]:
    """One dict per cell, from its run plan: name, axis labels, overrides, run directory, parameters, tokens, the
    estimated peak memory per device (bytes, with the cell's and the other activation checkpointing setting, and
    its parts), its stable phase's folder, the step a branch of it starts from and the tokens that saves
    (``grid.branches``; 0 for a cell trained from step 0); for a cell that may train on a GPU (``train.accelerator``
    not cpu), its GPU-hours on ``gpu`` for the tokens it trains and whether it fits the GPU's memory (``fits``), else
    the setting that would (``fitting_setting``, null where none does: ``plan.memory.fitting_setting``)."""
    from hybrid_lightning.plan.memory import fitting_setting

    rows = []
    starts = branch_steps(grid.cells)
    for cell in grid.cells:
        plan = cell.plan
        tokens, memory = plan.budget.tokens, plan.memory_estimate
        saved = plan.budget.tokens_at(starts[cell.name])  # a branch trains from its stable phase's checkpoint
        row = {
            "name": cell.name, "axes": cell.labels, "overrides": cell.overrides, "run_dir": str(cell.run_dir),
            "non_embedding_params": plan.params["non_embedding"], "tokens": tokens,
            "stable_phase": phase.dir if (phase := cell.config.train.stable_phase) else None,
            "branch_from_step": starts[cell.name], "tokens_saved": saved,
            "peak_memory": memory.peak(), "peak_memory_other_checkpointing": memory.peak(not memory.checkpointing),
            "memory": dict(plan.memory),
        }
        if cell.config.train.accelerator != "cpu":
            setting = fitting_setting(plan, gpu.memory)
            hours = (tokens - saved) / gpu.tokens_per_s(plan.flops_per_token) / 3600  # the tokens it trains
            row |= {"gpu_hours": hours, "fits": setting == {}, "fitting_setting": setting or None}
        rows.append(row)
    return rows


def design_cells(grid: Grid) -> list[tuple]:
    """A grid's cells as the design check (``grid plan --verdicts``, analysis/design.py) reads them: (name,
    config as plain data, run plan), planned without their data, which need not exist before the grid runs
    (``grid`` loaded with ``resolve=False``). Exploratory cells are left out: no verdict reads them."""
    from hybrid_lightning.config import config_to_dict
    from hybrid_lightning.plan.resolve import plan_run

    planned = [(cell.name, plan_run(cell.config, sources=False)) for cell in grid.cells if not cell.exploratory]
    return [(name, config_to_dict(cfg), plan) for name, (cfg, plan) in planned]


def _fit(row: dict) -> str:
    if "fits" not in row:
        return "-"
    if row["fits"]:
        return "fits"
    setting = row["fitting_setting"]
    return " ".join(f"--set {k}={json.dumps(v)}" for k, v in setting.items()) if setting else "nothing fits"


def _gpu_hours(hours: float) -> str:
    """GPU-hours for people: three significant digits, and below 0.01 (36 GPU-seconds) only that."""
    return "<0.01" if 0 < hours < 0.01 else figure(hours)


def plan_table(grid: Grid, rows: list[dict], gpu: Gpu = DEFAULT_GPU) -> str:
    axes = list(grid.axes)
    on_gpu = [r for r in rows if "gpu_hours" in r]
    branched = any(r["tokens_saved"] for r in rows)
    header = ["cell", *axes, "non-emb params", "tokens", *(["saved"] * branched), "memory", "other ckpt"]
    header += ["GPU-h", f"on {gib(gpu.memory)}"] if on_gpu else []
    table = [header]
    for row in rows:
        line = [row["name"], *(format_value(row["axes"][a]) for a in axes), si(row["non_embedding_params"]),
                si(row["tokens"]), *([si(row["tokens_saved"]) if row["tokens_saved"] else "-"] * branched),
                gib(row["peak_memory"]), gib(row["peak_memory_other_checkpointing"])]
        if on_gpu:
            line += [_gpu_hours(row["gpu_hours"]) if "gpu_hours" in row else "-", _fit(row)]
        table.append(line)
    lines = [format_table(table, left=(0, len(header) - 1) if on_gpu else (0,)),
             f"{len(rows)} cells, {si(sum(r['tokens'] for r in rows))} tokens; run directories in {grid.root}",
             "memory: estimated peak per device (plan/memory.py); other ckpt: the same with "
             "train.activation_checkpointing switched"]
    if branched:
        lines.append(_branch_line(rows))
    if on_gpu:
        over = [r for r in on_gpu if not r["fits"]]
        total = _gpu_hours(sum(r["gpu_hours"] for r in on_gpu))
        lines.append(f"GPU-h: {total} GPU-hours in all at {gpu.speed()} per GPU "
                     f"({gpu.name}, {gpu.source}; a profile's gpu: section, --tflops or --throughput change it)")
        lines.append(f"on {gib(gpu.memory)}: {len(over)} of {len(on_gpu)} cells exceed the GPU's memory" + (
            "; the column names the setting that fits, keeping each cell's tokens per step" if over else ""))
    return "\n".join(lines)


def _branch_line(rows: list[dict]) -> str:
    """The tokens the shared stable phases save, in all and per stable phase in units of its model's non-embedding
    parameters (N)."""
    tokens, saved = sum(r["tokens"] for r in rows), sum(r["tokens_saved"] for r in rows)
    phases = len({r["stable_phase"] for r in rows if r["stable_phase"]})
    per_n = sum(r["tokens"] / r["non_embedding_params"] for r in rows if r["stable_phase"]) / phases
    saved_n = sum(r["tokens_saved"] / r["non_embedding_params"] for r in rows) / phases
    return (f"saved: {phases} shared stable phases (share_stable_phase) train {si(tokens - saved)} tokens instead of "
            f"{si(tokens)}, each {figure(per_n - saved_n)} N instead of {figure(per_n)} N on average: every branch "
            "from its stable phase's checkpoint at its decay start, once the longest budget has passed it; GPU-h "
            "counts the tokens trained")


def dry_run_table(grid: Grid) -> str:
    """What ``grid submit`` would train: each cell it would submit with its steps, tokens and time
    (``training.dryrun.estimates``: throughputs measured here, the cells' distinct training steps together), and the
    total."""
    from hybrid_lightning.grid.submit import unfinished
    from hybrid_lightning.training.dryrun import duration, estimates

    todo = unfinished(grid, cell_states(grid))
    table = [["cell", "state", "steps", "tokens", "tokens/s", "time"]]
    found = estimates([(cell.config, cell.plan) for cell, _ in todo]) if todo else []
    for (cell, state), est in zip(todo, found):
        table.append([cell.name, state.state, f"{est.steps:,}", si(est.tokens), f"{est.tokens_per_s:,.0f}",
                      duration(est.seconds)])
    return (f"{format_table(table, left=(0, 1))}\n{len(todo)} of {len(grid.cells)} cells to submit, about "
            f"{duration(sum(e.seconds for e in found))} of training one after another (throughput measured here; "
            "evaluations not counted); nothing written")


def status_table(rows: list[CellState]) -> str:
    # score, beyond: the last val_longctx/score (lengths up to train.seq_len) and val_longctx/score_beyond (longer ones)
    table = [["cell", "state", "step", "loss", "score", "beyond", "job", "log"]]
    for r in rows:
        table.append([
            r.name, r.state, f"{r.step or 0}/{r.max_steps or '-'}",
            *("-" if v is None else f"{v:.3f}" for v in (r.loss, r.longctx, r.longctx_beyond)),
            r.job_id or "-", r.log or "-",
        ])
    counts = Counter(r.state for r in rows)
    lines = [format_table(table, left=(0, 1, 6, 7)),
             f"{len(rows)} cells: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
    lines += [f"{r.state} {r.name}: {r.reason}" for r in rows
              if r.reason and r.state in ("failed", "cancelled", "incomplete")]
    return "\n".join(lines)
