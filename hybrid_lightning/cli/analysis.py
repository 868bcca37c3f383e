"""The commands of a folder of runs: ``analyze``, ``demo``, ``pack`` and ``unpack``."""

from __future__ import annotations

import argparse
import importlib.resources
from pathlib import Path

from hybrid_lightning.cli.args import command
from hybrid_lightning.rundir import runs_under


def demo_grid() -> Path:
    """``ablations/demo.yaml``: the source tree's when run from a clone, else the copy installed with the
    package (``hybrid_lightning.ablations``, see pyproject.toml)."""
    src = Path(__file__).resolve().parents[2] / "ablations" / "demo.yaml"
    if src.is_file():
        return src
    return Path(str(importlib.resources.files("hybrid_lightning.ablations") / "demo.yaml"))


def planned_cells(grid) -> list[tuple[str, Path, str | None]]:
    """A grid's cells as analysis takes them: (name, run directory, why it failed where ``grid status`` says it did,
    else None)."""
    from hybrid_lightning.grid.state import cell_states

    return [(c.name, c.run_dir, row.reason if row.state == "failed" else None)
            for c, row in zip(grid.cells, cell_states(grid))]


def exploratory_dirs(grid) -> set[Path]:
    """The run directories of a grid's exploratory cells (its ``exploratory`` entries), which no verdict reads."""
    return {c.run_dir for c in grid.cells if c.exploratory}


def cmd_analyze(args: argparse.Namespace) -> int:
    planned, exploratory, declared = None, set(), None
    if args.grid is not None:
        from hybrid_lightning.grid.spec import load_grid

        grid = load_grid(args.grid, args.dir, resolve=False)  # its data need not exist here
        planned, exploratory, declared = planned_cells(grid), exploratory_dirs(grid), grid.verdicts.declared()
    runs_under(args.dir)  # DIR checked before the analysis (pandas, matplotlib, scipy) is imported
    from hybrid_lightning.analysis.report import analyze

    report = analyze(args.dir, args.out, args.metric, planned, findings=args.findings, exploratory=exploratory,
                     declared=declared)
    if args.findings:
        print((report.parent / "findings.md").read_text())
    print(f"report written to {report}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from hybrid_lightning.analysis.report import analyze
    from hybrid_lightning.grid import load_grid, submit_grid

    grid_file = args.grid or demo_grid()
    grid = load_grid(grid_file, args.root)
    code = submit_grid(grid, "local", parallel=args.parallel)
    report = analyze(grid.root, args.out, planned=planned_cells(grid), findings=True,
                     exploratory=exploratory_dirs(grid), declared=grid.verdicts.declared())
    print(f"report.md and findings.md written to {report.parent}")
    return code


def add_parsers(sub) -> None:
    """``analyze``, ``pack``, ``unpack`` and ``demo``."""
    from hybrid_lightning.analysis.metrics import METRICS
    from hybrid_lightning.analysis.pack import add_parsers as add_pack_parsers

    p = command(sub, "analyze", "figures, CSV tables and report.md from a folder of runs (a grid root or any)",
                "analysis.md")
    p.add_argument("dir",
                   help="folder searched recursively for run directories (folders with config.yaml; .grid/ skipped)")
    p.add_argument("--out", help="output folder (default: DIR/analysis)")
    p.add_argument("--metric", choices=list(METRICS), default="score",
                   help="long-context score (default score: answer-token accuracy minus chance)")
    p.add_argument("--grid", help="the grid file of DIR: the report lists its cells that have no run directory")
    p.add_argument("--findings", action="store_true",
                   help="open the report with rule-based verdicts on the paper's three findings (analysis/findings.py)")
    p.set_defaults(func=cmd_analyze)

    add_pack_parsers(sub, command)

    p = command(sub, "demo",
                "train a demo grid locally, then analyse it (grid submit --executor local + analyze --findings)",
                "analysis.md")
    p.add_argument("--grid", help="grid file (default: ablations/demo.yaml, installed with the package)")
    p.add_argument("--root", help="folder of the cells' run directories (default: runs/<grid name>)")
    p.add_argument("--parallel", type=int, default=2, metavar="N", help="cells trained at once (default 2)")
    p.add_argument("--out", help="analysis output folder (default: <root>/analysis)")
    p.set_defaults(func=cmd_demo)
