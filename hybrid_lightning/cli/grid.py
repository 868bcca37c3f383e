"""``grid plan``, ``grid submit``, ``grid status`` and ``grid cancel``. ``status`` and ``cancel`` read the grid's
cells without planning them (what the runs recorded says the rest): neither loads torch. ``plan`` plans every
cell it shows (parameters, memory: torch, not Lightning); ``submit`` plans the cells it submits."""

from __future__ import annotations

import argparse
import json

from hybrid_lightning.cli.args import add_set, command
from hybrid_lightning.cli.run import add_preview_args
from hybrid_lightning.config import dump_config


def _executor(args: argparse.Namespace):
    """The executor class ``grid plan`` and ``grid submit`` ask (``executor.executor_for``)."""
    from hybrid_lightning.grid.executor import executor_for

    return executor_for(args.executor, args.profile, args.overrides)


def _grid(args: argparse.Namespace, resolve: bool = True, executor=None):
    """The grid of ``args``, its ``--set`` items of the run config applied; the others are ``executor``'s
    parameters (``Executor.split_set``), refused where the command takes no executor."""
    from hybrid_lightning.grid.executor import CELL_KEYS, is_config_item
    from hybrid_lightning.grid.spec import load_grid

    items = getattr(args, "overrides", [])
    cell = executor.split_set(items)[0] if executor is not None else items
    wrong = [item for item in cell if not is_config_item(item)]
    if wrong:
        raise ValueError(f"--set {wrong[0]}: not a key of the run config ({', '.join(CELL_KEYS)}), and grid "
                         f"{args.grid_command} takes no executor parameters (grid plan and grid submit do)")
    return load_grid(args.grid, args.root, resolve, cell, getattr(args, "cells", ()) or ())


def cmd_grid_plan(args: argparse.Namespace) -> int:
    import sys

    from hybrid_lightning.grid.capacity import plan_gpu
    from hybrid_lightning.grid.report import design_cells, plan_rows, plan_table
    from hybrid_lightning.grid.submit import check_plan

    if args.verdicts:  # which verdicts of analyze --findings the grid can reach, before its data exists
        from hybrid_lightning.analysis.design import design_check

        grid = _grid(args, resolve=False)
        print(design_check(design_cells(grid), args.pilot, args.json, grid.verdicts.declared()))
        return 0
    gpu = plan_gpu(args.profile, args.tflops, args.throughput)  # a bad profile before any cell is planned
    executor = _executor(args)
    grid = _grid(args, executor=executor)
    check_plan(grid, executor.name, args.profile, executor.split_set(args.overrides)[1],
               say=lambda line: print(line, file=sys.stderr))
    rows = plan_rows(grid, gpu)
    print(json.dumps(rows, indent=1) if args.json else plan_table(grid, rows, gpu))
    return 0


def cmd_grid_submit(args: argparse.Namespace) -> int:
    from hybrid_lightning.grid.executor import EXECUTORS

    if not (args.print_config or args.dry_run) and args.executor not in EXECUTORS:
        raise ValueError(f"--executor {args.executor or 'is missing'}: one of {list(EXECUTORS)}")
    executor = _executor(args)
    grid = _grid(args, executor=executor)
    # every cell's config as one YAML document, or the cost of the cells to submit
    if args.print_config or args.dry_run:
        from hybrid_lightning.grid.report import dry_run_table
        from hybrid_lightning.grid.submit import check_starts

        check_starts(grid)  # what train would refuse of a cell, refused by the preview too

        configs = (f"---\n# cell {c.name}: {c.run_dir}\n{dump_config(c.config)}" for c in grid.cells)
        print("".join(configs) if args.print_config else dry_run_table(grid))
        return 0
    from hybrid_lightning.grid.submit import submit_grid

    overrides = executor.split_set(args.overrides)[1]
    return submit_grid(grid, args.executor, args.profile, args.parallel, overrides=overrides)


def cmd_grid_status(args: argparse.Namespace) -> int:
    from hybrid_lightning.grid.report import status_table
    from hybrid_lightning.grid.state import cell_states

    rows = cell_states(_grid(args, resolve=False))
    print(json.dumps([r.as_dict() for r in rows], indent=1) if args.json else status_table(rows))
    return 0


def cmd_grid_cancel(args: argparse.Namespace) -> int:
    from hybrid_lightning.grid.submit import cancel_grid

    return cancel_grid(_grid(args, resolve=False), args.names)


def cmd_grid_tensorboard(args: argparse.Namespace) -> int:
    from hybrid_lightning.grid.tensorboard import write_seed_runs
    from hybrid_lightning.training.layout import viewer_hint

    grid = _grid(args, resolve=False)
    folders = write_seed_runs(grid)
    print(f"grid {grid.name}: {len(folders)} arm(s) with several seeds written as runs under {grid.root / 'seeds'}"
          f"\n{viewer_hint(grid.root)}   (the headline of every cell, and over seeds)")
    return 0


def _add_selection(p: argparse.ArgumentParser, profile: bool = False) -> None:
    add_set(p, "set a config value in every cell (not one an axis sets)" + (
        "; a key outside the run config sets a parameter of the executor's profile, e.g. --set timeout_min=60"
        if profile else ""), "train.max_steps=20")
    p.add_argument("--cells", action="append", metavar="PATTERN", help="only the cells whose names match this glob, "
                   "e.g. --cells 'arch=full,*' (repeatable; quote it for the shell)")


def add_parsers(sub) -> None:
    grid = command(sub, "grid", "ablation grids: plan, submit (SLURM or local), status, cancel", "grids.md")
    actions = grid.add_subparsers(dest="grid_command", required=True, metavar="ACTION")

    def action(name: str, help: str, func) -> argparse.ArgumentParser:
        p = command(actions, name, help, "grids.md")
        p.add_argument("grid", help="grid file (YAML: base, axes, zip, exclude)")
        p.add_argument("--root",
                       help="folder of the cells' run directories (default: the grid's root, else runs/<grid name>)")
        p.set_defaults(func=func)
        return p

    p = action("plan", "validate every cell and print them: parameters, tokens, memory, GPU-hours and whether each "
               "fits the GPU", cmd_grid_plan)
    _add_selection(p, profile=True)
    p.add_argument("--json", action="store_true", help="the cells as a JSON list")
    p.add_argument("--executor", metavar="NAME", help="the executor whose machines the cells are checked against "
                   "(default: the one that takes a profile where --profile or a profile --set is given, else local)")
    p.add_argument("--profile", help="SLURM profile: each cell's nodes and tasks checked against it and, where SLURM "
                   "answers, its partition (without a profile or a profile --set: CPU cells against this machine's "
                   "cores); its gpu: section states the GPU (memory, TFLOP/s), default an H100 80GB at 400 TFLOP/s")
    p.add_argument("--verdicts", action="store_true",
                   help="instead, the verdicts the grid can reach: floors, power (analysis.md)")
    p.add_argument("--pilot", metavar="RUNS", help="with --verdicts: effects and variances from the runs under RUNS")
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--throughput", type=float, metavar="TOKENS_PER_S",
                       help="training tokens per second per GPU, for GPU-hours")
    speed.add_argument("--tflops", type=float, metavar="TFLOPS",
                       help="sustained training TFLOP/s per GPU, for GPU-hours from each cell's FLOPs per token")
    p = action("submit", "submit the cells that are neither done nor live; resume the others", cmd_grid_submit)
    _add_selection(p, profile=True)
    p.add_argument("--executor", metavar="NAME",
                   help="local, slurm or another registered executor (docs/grids.md); needed to submit")
    p.add_argument("--profile", help="SLURM profile: a YAML of submitit AutoExecutor parameters (slurm/*.yaml)")
    p.add_argument("--parallel", type=int, default=1, metavar="N",
                   help="local executor: cells trained at once (default 1)")
    add_preview_args(p)
    p = action("status", "one row per cell: state, step, loss, job, log", cmd_grid_status)
    _add_selection(p)
    p.add_argument("--json", action="store_true", help="the rows as a JSON list")
    action("tensorboard", "write each arm's mean and range over its seeds as TensorBoard runs (seeds/<arm>) for the "
           "margin charts of the CUSTOM SCALARS tab", cmd_grid_tensorboard)
    p = action("cancel", "cancel the live jobs of the grid (or of the cells named)", cmd_grid_cancel)
    p.add_argument("names", nargs="*", metavar="cells", help="cell names (default: every cell)")
