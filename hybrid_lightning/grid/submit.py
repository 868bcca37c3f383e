"""``grid submit`` and ``grid cancel``: idempotent submission of a grid's unfinished cells."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from hybrid_lightning.grid.branches import launch_order
from hybrid_lightning.grid.executor import executor_class, executor_for
from hybrid_lightning.grid.spec import Cell, Grid
from hybrid_lightning.grid.state import CellState, cell_states, lock, read_jobs, record_plan, write_jobs
from hybrid_lightning.grid.tensorboard import write_hparams
from hybrid_lightning.training.preflight import check_start


def submit_grid(
    grid: Grid, executor: str, profile: str | Path | None = None, parallel: int = 1, say: Callable[[str], None] = print,
    overrides: Sequence[str] = (),
) -> int:
    """Submits every cell that is neither done nor live (pending, running, requeued); failed,
    cancelled and partial cells resume from their checkpoints. Returns the exit code: 0, or the
    executor's when it runs the cells itself (``local``: 1 when a cell did not finish).

    Everything is checked before anything is submitted: the grid's cells (by ``load_grid``), the
    executor's options and what it needs (``Executor.check``: e.g. the profile and SLURM), that it
    can run every cell (``Executor.check_cells``: e.g. the world against the profile and the
    partition), and that no cell's run directory holds a run with another config. A lock makes
    concurrent submits of one grid submit each cell once.

    Args:
        grid: the expanded grid.
        executor: a name in ``executor.EXECUTORS``: ``slurm`` (submitit job arrays) or ``local``
            (this machine, ``parallel`` at a time).
        profile: the executor's profile file (``slurm``: submitit parameters).
        parallel: cells run at once by the local executor.
        say: where progress lines go.
        overrides: ``--set PARAM=VALUE`` items over the profile's parameters.
    """
    runner = executor_class(executor)(profile, parallel, overrides)
    runner.check()
    _checked(grid, runner.check_cells, say)
    check_starts(grid)

    with lock(grid):
        rows = cell_states(grid)
        todo = launch_order([cell for cell, _ in unfinished(grid, rows)])  # a stable phase's longest budget first
        counts = Counter(r.state for r in rows)
        summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        say(f"grid {grid.name}: {len(rows)} cells ({summary}); {len(todo)} to submit; run directories in {grid.root}")
        if todo:
            for cell in todo:  # each job checks the plan it makes against this one
                record_plan(grid, cell)
            runner.submit(grid, todo, say)
        write_hparams(grid)
    return runner.run(grid, todo, say) if todo else 0


def check_starts(grid: Grid) -> None:
    """What ``train`` refuses of each cell wherever it starts (``training.preflight.check_start``: its run directory,
    its token store), the refusal naming the grid and the cell."""
    for cell in grid.cells:
        try:
            check_start(cell.config, cell.run_dir, flag="--root")
        except ValueError as e:
            raise ValueError(f"grid {grid.name}: cell {cell.name}: {e}") from None


def check_plan(grid: Grid, executor: str | None = None, profile: str | Path | None = None,
               overrides: Sequence[str] = (), say: Callable[[str], None] = print) -> None:
    """``grid plan``'s check that every cell would start (``check_starts``) and of where the cells would run, asked
    of the executor (``executor.executor_for``: the one named; else with a profile or ``--set`` parameters the one
    that takes a profile, e.g. SLURM's profile world and partition; else this machine's cores for cells with
    ``train.accelerator: cpu``)."""
    check_starts(grid)
    runner = executor_for(executor, profile, overrides)(profile, overrides=overrides)
    _checked(grid, runner.check_plan, say)


def _checked(grid: Grid, check: Callable[[list[Cell]], str | None], say: Callable[[str], None]) -> None:
    """Runs an executor's ``check_cells`` on the grid's cells: its refusal names the grid, its note is said."""
    try:
        note = check(grid.cells)
    except ValueError as e:
        raise ValueError(f"grid {grid.name}: {e}") from None
    if note:
        say(f"grid {grid.name}: {note}")


def unfinished(grid: Grid, rows: list[CellState]) -> list[tuple[Cell, CellState]]:
    """The cells ``submit_grid`` submits, with their states (``rows``, one per cell): neither done nor live."""
    return [(cell, row) for cell, row in zip(grid.cells, rows) if row.state != "done" and not row.live]


def cancel_grid(grid: Grid, names: list[str] | tuple[str, ...] = (), say: Callable[[str], None] = print) -> int:
    """Cancels the live jobs of the named cells (all when none), each through the executor that
    submitted it (``scancel`` for SLURM jobs, SIGTERM for local processes; queued local cells are
    dropped). Returns 0."""
    cells = grid.select(names)
    with lock(grid):
        jobs = read_jobs(grid)
        live = [r for r in cell_states(grid, cells) if r.live and not jobs[r.name][-1].get("cancelled")]
        by_executor: dict[str, list[dict]] = {}
        for row in live:
            record = jobs[row.name][-1]
            by_executor.setdefault(record["executor"], []).append(record)
        for name, records in by_executor.items():
            executor_class(name)().cancel(records)
            for record in records:
                record["cancelled"] = True
        write_jobs(grid, jobs)
    say(f"grid {grid.name}: cancelled {len(live)} cell(s)"
        + "".join(f"\n  {r.name} ({r.state}, job {r.job_id})" for r in live))
    return 0
