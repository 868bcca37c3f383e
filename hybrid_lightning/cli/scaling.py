"""``hybrid-lightning scaling TABLE``: the paper's scaling law fitted to a plain table with the columns of the
authors' released files (analysis/scaling.py, docs/scaling.md). Loads neither torch nor Lightning."""

from __future__ import annotations

import argparse
from pathlib import Path

from hybrid_lightning.cli.args import command


def _bound(text: str) -> tuple[str, tuple[float | None, float | None]]:
    """``alpha=0.2:0.3`` (either end may be empty: unbounded) -> ("alpha", (0.2, 0.3))."""
    name, sep, ends = text.partition("=")
    low, colon, high = ends.partition(":")
    try:
        if not (sep and colon):
            raise ValueError
        return name.strip(), (float(low) if low.strip() else None, float(high) if high.strip() else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=LOW:HIGH, e.g. alpha=0.2:0.3") from None


def cmd_scaling(args: argparse.Namespace) -> int:
    from hybrid_lightning.analysis import scaling
    from hybrid_lightning.analysis.figures import save
    from hybrid_lightning.analysis.scaling_figures import laws

    bounds = dict(args.bounds)
    unknown = sorted(set(bounds) - set(scaling.FORMS[args.form]))
    if unknown:
        raise ValueError(f"--bound: {unknown} not among the parameters of --form {args.form}: "
                         f"{list(scaling.FORMS[args.form])}")
    if Path(args.table).is_dir():
        return _runs(args, bounds)
    table = scaling.read_table(args.table)
    fit = scaling.fit_table(table, args.form, args.longppl, None if args.hold_out == "none" else args.hold_out,
                            bounds, ftol=scaling.FTOL if args.ftol is None else args.ftol)
    params = scaling.parameters(fit)
    if args.resamples:
        ci = scaling.intervals(fit, scaling.bootstrap(fit, args.resamples))
        params = params.merge(ci.drop(columns="value"), on="parameter", how="left")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    params.to_csv(out / "parameters.csv", index=False)
    fit.held_out.to_csv(out / "held_out.csv", index=False)
    quantity = "log LongPPL" if args.longppl else "loss"
    save(laws({Path(args.table).stem: fit}, quantity), out / "scaling.png")
    print(f"{args.form} law of {quantity}, fitted to {len(fit.fitted)} cells (Huber delta {fit.settings['delta']:g} "
          f"on log residuals, objective {fit.law.objective:.6g}):")
    print(params.to_string(index=False, float_format=lambda v: f"{v:.6g}"))
    if len(fit.held_out):
        print(f"\nheld out ({args.hold_out} size), actual vs predicted:")
        print(fit.held_out.to_string(index=False, float_format=lambda v: f"{v:.6g}"))
    print(f"\nparameters.csv, held_out.csv and scaling.png written to {out}")
    return 0


def _runs(args: argparse.Namespace, bounds: dict) -> int:
    """TABLE is a folder of runs: every architecture with a size and a budget axis fitted per metric."""
    from hybrid_lightning.analysis import scaling
    from hybrid_lightning.analysis.load import load_runs
    from hybrid_lightning.analysis.scaling_runs import write_fits
    from hybrid_lightning.rundir import runs_under

    if args.hold_out != "largest":
        raise ValueError("--hold-out none: a folder of runs is fitted with its largest size held out")
    runs = load_runs(runs_under(args.table), root=args.table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = write_fits(runs, out, args.form, args.resamples or None, bounds=bounds,
                         ftol=scaling.FTOL if args.ftol is None else args.ftol)
    if not written:
        raise ValueError(f"TABLE: no architecture among the runs of {args.table} has finished runs at 3+ sizes and "
                         "2+ budgets (a size and a budget axis)")
    print(f"{', '.join(written)} written to {out}")
    return 0


def add_parsers(sub) -> None:
    """``scaling``."""
    p = command(sub, "scaling", "fit the paper's scaling law to a table of sizes x budgets and predict the largest "
                "size held out", "scaling.md")
    p.add_argument("table", help="TSV or CSV with the columns model_size, token_multiplier (tokens per parameter, "
                   "e.g. 200.1n), n (non-embedding parameters), loss (a loss, or LongPPL with --longppl); or a "
                   "folder of runs: each architecture's LongPPL and val/text_loss fitted over its sizes and budgets")
    p.add_argument("--longppl", action="store_true",
                   help="the loss column is LongPPL: fit the log of its log, as the authors do")
    p.add_argument("--hold-out", choices=["largest", "none"], default="largest",
                   help="cells held out and predicted (default: those of the largest size)")
    p.add_argument("--form", choices=["no_constant", "constant"], default="no_constant",
                   help="no_constant (the paper's): logsumexp(B - alpha log N, C - beta log D); constant: with A")
    p.add_argument("--bound", action="append", type=_bound, default=[], dest="bounds", metavar="NAME=LOW:HIGH",
                   help="bound a parameter, e.g. --bound alpha=0.2:0.3 as the authors' script does (repeatable)")
    p.add_argument("--ftol", type=float,
                   help="L-BFGS-B tolerance of the final polish (default: on to the minimum; 1e-8 stops where the "
                        "authors' script stops)")
    p.add_argument("--resamples", type=int, default=0, metavar="N",
                   help="bootstrap resamples for 95%% intervals of the parameters (about 0.3 s each; default 0: none "
                        "for a table, 200 for a folder of runs)")
    p.add_argument("--out", required=True, help="folder for parameters.csv, held_out.csv and scaling.png")
    p.set_defaults(func=cmd_scaling)
