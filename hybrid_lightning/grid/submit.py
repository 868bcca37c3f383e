"""``grid submit`` and ``grid cancel``: idempotent submission of a grid's unfinished cells."""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from hybrid_lightning.grid.spec import Grid
from hybrid_lightning.grid.state import add_records, cell_states, check_slurm, lock, read_jobs, write_jobs
from hybrid_lightning.grid.tensorboard import write_hparams
from hybrid_lightning.training.run import check_same_run

EXECUTORS = ("slurm", "local")


def submit_grid(
    grid: Grid, executor: str, profile: str | Path | None = None, parallel: int = 1, say: Callable[[str], None] = print
) -> int:
    """Submits every cell that is neither done nor live (pending, running, requeued); failed,
    cancelled and partial cells resume from their checkpoints. Returns the exit code: 0, or 1
    when a cell run by the local executor did not finish.

    Everything is checked before anything is submitted: the grid's cells (by ``load_grid``), the
    profile, SLURM, and that no cell's run directory holds a run with another config. A lock
    makes concurrent submits of one grid submit each cell once.

    Args:
        grid: the expanded grid.
        executor: ``slurm`` (submitit job arrays) or ``local`` (this machine, ``parallel`` at a time).
        profile: the SLURM profile YAML (``slurm`` only).
        parallel: cells trained at once by the local executor.
        say: where progress lines go.
    """
    if executor not in EXECUTORS:
        raise ValueError(f"--executor must be one of {list(EXECUTORS)}, got {executor!r}")
    if executor == "slurm":
        from hybrid_lightning.grid.slurm import load_profile, submit_slurm

        checked_profile = load_profile(profile)
        check_slurm()
    elif profile is not None:
        raise ValueError("--profile applies to --executor slurm only")
    if parallel < 1:
        raise ValueError(f"--parallel must be at least 1, got {parallel}")
    for cell in grid.cells:
        try:
            check_same_run(cell.run_dir, cell.config)
        except ValueError as e:
            raise ValueError(f"grid {grid.name}: cell {cell.name}: {e}") from None

    with lock(grid):
        rows = cell_states(grid)
        todo = [c for c, r in zip(grid.cells, rows) if r.state != "done" and not r.live]
        counts = Counter(r.state for r in rows)
        summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        say(f"grid {grid.name}: {len(rows)} cells ({summary}); {len(todo)} to submit; run directories in {grid.root}")
        if todo and executor == "slurm":
            submit_slurm(grid, todo, checked_profile, say)
        elif todo:
            from hybrid_lightning.grid.local import queue_local

            add_records(grid, queue_local(grid, todo))
        write_hparams(grid)
    if executor == "local" and todo:
        from hybrid_lightning.grid.local import run_local

        left = run_local(grid, todo, parallel, say)
        say(f"grid {grid.name}: {len(todo) - left} of {len(todo)} cell(s) finished" + (
            f"; see `hybrid-lightning grid status {grid.path}`" if left else ""))
        return min(left, 1)
    return 0


def cancel_grid(grid: Grid, names: list[str] | tuple[str, ...] = (), say: Callable[[str], None] = print) -> int:
    """Cancels the live jobs of the named cells (all when none): ``scancel`` for SLURM jobs,
    SIGTERM for local processes; queued local cells are dropped. Returns 0."""
    cells = grid.select(names)
    with lock(grid):
        jobs = read_jobs(grid)
        live = [r for r in cell_states(grid, cells) if r.live and not jobs[r.name][-1].get("cancelled")]
        slurm_ids = []
        for row in live:
            record = jobs[row.name][-1]
            if record.get("executor") == "slurm":
                slurm_ids.append(record["job_id"])
            elif record.get("pid"):
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(record["pid"], signal.SIGTERM)
            record["cancelled"] = True
        if slurm_ids:
            from hybrid_lightning.grid.slurm import cancel_slurm

            cancel_slurm(slurm_ids)
        write_jobs(grid, jobs)
    say(f"grid {grid.name}: cancelled {len(live)} cell(s)" + "".join(f"\n  {r.name} ({r.state}, job {r.job_id})" for r in live))
    return 0
