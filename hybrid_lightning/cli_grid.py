"""The ``hybrid-lightning grid`` commands: plan, submit, status, cancel (``docs/grids.md``). Part of the
command line (``cli.py``); the grid package is imported only when a command runs (it is slow to import)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from hybrid_lightning.config import dump_config


def cmd_grid_plan(args: argparse.Namespace) -> int:
    import json

    from hybrid_lightning.grid import load_grid
    from hybrid_lightning.grid.report import plan_rows, plan_table, planned_cells
    from hybrid_lightning.grid.submit import check_plan

    if args.verdicts:  # which verdicts of analyze --findings the grid can reach, before its data exists
        from hybrid_lightning.analysis.design import design_check
        print(design_check(planned_cells(args.grid, args.root), args.pilot, args.json))
        return 0
    grid = load_grid(args.grid, args.root)
    check_plan(grid, args.profile, args.profile_overrides, say=lambda line: print(line, file=sys.stderr))
    rows = plan_rows(grid, args.throughput, args.tflops)
    print(json.dumps(rows, indent=1) if args.json else plan_table(grid, rows))
    return 0


def cmd_grid_submit(args: argparse.Namespace) -> int:
    from hybrid_lightning.grid import EXECUTORS, load_grid, submit_grid
    from hybrid_lightning.grid.report import dry_run_table

    if not (args.print_config or args.dry_run) and args.executor not in EXECUTORS:
        raise ValueError(f"--executor {args.executor or 'is missing'}: one of {list(EXECUTORS)}")
    grid = load_grid(args.grid, args.root)
    if args.print_config or args.dry_run:  # every cell's config as one YAML document, or the cost of the cells to submit
        configs = (f"---\n# cell {c.name}: {c.run_dir}\n{dump_config(c.config)}" for c in grid.cells)
        print("".join(configs) if args.print_config else dry_run_table(grid))
        return 0
    return submit_grid(grid, args.executor, args.profile, args.parallel, overrides=args.profile_overrides)


def cmd_grid_status(args: argparse.Namespace) -> int:
    import json

    from hybrid_lightning.grid import cell_states, load_grid
    from hybrid_lightning.grid.report import status_table

    rows = cell_states(load_grid(args.grid, args.root))
    print(json.dumps([r.as_dict() for r in rows], indent=1) if args.json else status_table(rows))
    return 0


def cmd_grid_cancel(args: argparse.Namespace) -> int:
    from hybrid_lightning.grid import cancel_grid, load_grid

    return cancel_grid(load_grid(args.grid, args.root), args.cells)


def add_grid_parsers(sub, command: Callable[..., argparse.ArgumentParser],
                     add_preview_args: Callable[[argparse.ArgumentParser], None]) -> None:
    """The ``grid`` command and its actions (``command``: the command line's way to add one;
    ``add_preview_args``: its ``--print-config`` / ``--dry-run``)."""
    grid = command(sub, "grid", "ablation grids: plan, submit (SLURM or local), status, cancel", "grids.md")
    actions = grid.add_subparsers(dest="grid_command", required=True, metavar="ACTION")

    def action(name: str, help: str, func, profile: str | None = None) -> argparse.ArgumentParser:
        p = command(actions, name, help, "grids.md")
        p.add_argument("grid", help="grid file (YAML: base, axes, zip, exclude)")
        p.add_argument("--root", help="folder of the cells' run directories (default: the grid's root, else runs/<grid name>)")
        if profile:  # a SLURM profile, and its parameters set one by one
            p.add_argument("--profile", help=profile)
            p.add_argument("--set", action="append", default=[], metavar="PARAM=VALUE", dest="profile_overrides",
                           help="set a SLURM profile parameter, e.g. --set timeout_min=60 (repeatable; the cells' "
                           "configs come from the grid file)")
        p.set_defaults(func=func)
        return p

    p = action("plan", "validate every cell and print them", cmd_grid_plan,
               "SLURM profile: check each cell's nodes and tasks against it and, where SLURM answers, against its "
               "partition (without a profile or --set: CPU cells against this machine's cores)")
    p.add_argument("--json", action="store_true", help="the cells as a JSON list")
    p.add_argument("--verdicts", action="store_true", help="instead, the verdicts the grid can reach: floors, power (analysis.md)")
    p.add_argument("--pilot", metavar="RUNS", help="with --verdicts: effects and variances from the runs under RUNS")
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--throughput", type=float, metavar="TOKENS_PER_S", help="training tokens per second per GPU, for GPU-hours")
    speed.add_argument("--tflops", type=float, metavar="TFLOPS",
                       help="sustained training TFLOP/s per GPU, for GPU-hours from each cell's FLOPs per token")
    p = action("submit", "submit the cells that are neither done nor live; resume the others", cmd_grid_submit,
               "SLURM profile: a YAML of submitit AutoExecutor parameters (slurm/*.yaml)")
    p.add_argument("--executor", metavar="NAME", help="local, slurm or another registered executor (docs/grids.md); needed to submit")
    p.add_argument("--parallel", type=int, default=1, metavar="N", help="local executor: cells trained at once (default 1)")
    add_preview_args(p)
    p = action("status", "one row per cell: state, step, loss, job, log", cmd_grid_status)
    p.add_argument("--json", action="store_true", help="the rows as a JSON list")
    p = action("cancel", "cancel the live jobs of the grid (or of the cells named)", cmd_grid_cancel)
    p.add_argument("cells", nargs="*", help="cell names (default: every cell)")
