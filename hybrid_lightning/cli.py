"""The ``hybrid-lightning`` command line."""

from __future__ import annotations

import argparse
import errno
import importlib.resources
import sys
from collections.abc import Callable
from pathlib import Path

from hybrid_lightning.config import RunConfig, load_config
from hybrid_lightning.rundir import IOFailure, read_status

# OSErrors of the machine rather than of the code: reported in one line with what to do.
_ENVIRONMENT_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO}
ConfigLoader = Callable[[argparse.Namespace], RunConfig]


def demo_grid() -> Path:
    """``ablations/demo.yaml``: the source tree's when run from a clone, else the copy installed with the
    package (``hybrid_lightning.ablations``, see pyproject.toml)."""
    src = Path(__file__).resolve().parents[1] / "ablations" / "demo.yaml"
    if src.is_file():
        return src
    return Path(str(importlib.resources.files("hybrid_lightning.ablations") / "demo.yaml"))


def _add_config_args(p: argparse.ArgumentParser, optional: bool = True) -> None:
    p.add_argument("config", nargs="?" if optional else None, help="run config YAML (default: the embedded default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                   help="override a config value, e.g. --set model.window=128 (repeatable)")


def _load(args: argparse.Namespace) -> RunConfig:
    return load_config(args.config, args.overrides)


def cmd_train(args: argparse.Namespace) -> int:
    from hybrid_lightning.training.run import train
    from hybrid_lightning.training.stop import Stopped

    try:
        run_dir = train(_load(args), args.run_dir)
    except Stopped as e:  # SIGTERM / SIGINT: the step reached is saved (unless a second signal came)
        where = f" at step {e.step}" if e.step is not None else ""
        print(f"hybrid-lightning train: stopped by {e}{where}; run the same command again to resume", file=sys.stderr)
        return 128 + e.signum
    status = read_status(run_dir) or {}
    if status.get("state") == "interrupted":
        print(f"{run_dir}: stopped at step {status.get('step')}; run the same command again to resume")
    return 0


def cmd_params(args: argparse.Namespace) -> int:
    import torch

    from hybrid_lightning.model import build_model, count_params, resolve_model_config
    from hybrid_lightning.model.matching import param_report
    from hybrid_lightning.training.run import resolve_config

    cfg = resolve_config(_load(args))
    model_cfg = resolve_model_config(cfg.model)
    with torch.device("meta"):  # counts without allocating weights
        model = build_model(model_cfg)
    counts = count_params(model)
    rows = [("layer", "kind", "window", "pos", "mixer", "mlp", "mlp width", "norm", "total")]
    for layer, spec in zip(counts["layers"], model.plan):
        rows.append((str(layer["layer"]), layer["kind"], str(layer["window"] or "-"), str(layer["pos"] or "-"),
                     f"{layer['mixer']:,}", f"{layer['mlp']:,}", str(spec.mlp_hidden), f"{layer['norm']:,}",
                     f"{layer['total']:,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    print(f"non-embedding {counts['non_embedding']:,}  embedding {counts['embedding']:,}  total {counts['total']:,}")
    match = param_report(model_cfg)
    how = (f"non-full SwiGLU width {match.width}, matched from {match.base_width}" if model_cfg.match_params
           else "not matched (set model.match_params to match)")
    print(f"reference (pattern {match.reference_pattern}) non-embedding {match.reference:,}  this model "
          f"{match.matched:,}  deviation {match.deviation:+.2%}  {how}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from hybrid_lightning.offline import evaluate_checkpoint
    from hybrid_lightning.eval.report import report_path, table

    overrides = list(args.overrides)
    for key, values in (("tasks", args.tasks), ("lengths", args.lengths)):
        if values:
            overrides.append(f"eval.{key}=[{','.join(values)}]")
    report = evaluate_checkpoint(args.run_dir, args.ckpt, overrides)
    print(table(report))
    print(f"written to {report_path(args.run_dir, report['step'])}")
    return 0


def _planned_cells(grid) -> list[tuple[str, Path]]:
    """A grid's cells as analysis takes them: (name, run directory)."""
    return [(c.name, c.run_dir) for c in grid.cells]


def cmd_analyze(args: argparse.Namespace) -> int:
    from analysis.report import analyze

    planned = None
    if args.grid is not None:
        from hybrid_lightning.grid import load_grid

        planned = _planned_cells(load_grid(args.grid, args.dir))
    report = analyze(args.dir, args.out, args.metric, planned, findings=args.findings)
    if args.findings:
        print((report.parent / "findings.md").read_text())
    print(f"report written to {report}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from analysis.report import analyze
    from hybrid_lightning.grid import load_grid, submit_grid

    grid_file = args.grid or demo_grid()
    grid = load_grid(grid_file, args.root)
    code = submit_grid(grid, "local", parallel=args.parallel)
    print(f"report written to {analyze(grid.root, args.out, planned=_planned_cells(grid))}")
    return code


def _add_analysis_parsers(sub) -> None:
    from analysis.metrics import METRICS

    p = sub.add_parser("analyze", help="figures, CSV tables and report.md from a folder of runs (a grid root or any)")
    p.add_argument("dir", help="folder searched recursively for run directories (folders with config.yaml; .grid/ skipped)")
    p.add_argument("--out", help="output folder (default: DIR/analysis)")
    p.add_argument("--metric", choices=list(METRICS), default="token_acc",
                   help="long-context score (default token_acc: answer-token accuracy minus chance)")
    p.add_argument("--grid", help="the grid file of DIR: the report lists its cells that have no run directory")
    p.add_argument("--findings", action="store_true",
                   help="open the report with rule-based verdicts on the paper's three findings (analysis/findings.py)")
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("demo", help="train a demo grid locally, then analyse it (grid submit --executor local + analyze)")
    p.add_argument("--grid", help="grid file (default: ablations/demo.yaml, installed with the package)")
    p.add_argument("--root", help="folder of the cells' run directories (default: runs/<grid name>)")
    p.add_argument("--parallel", type=int, default=2, metavar="N", help="cells trained at once (default 2)")
    p.add_argument("--out", help="analysis output folder (default: <root>/analysis)")
    p.set_defaults(func=cmd_demo)


def cmd_grid_plan(args: argparse.Namespace) -> int:
    import json

    from hybrid_lightning.grid import load_grid
    from hybrid_lightning.grid.report import plan_rows, plan_table

    grid = load_grid(args.grid, args.root)
    rows = plan_rows(grid, args.throughput, args.tflops)
    print(json.dumps(rows, indent=1) if args.json else plan_table(grid, rows))
    return 0


def cmd_grid_submit(args: argparse.Namespace) -> int:
    from hybrid_lightning.grid import load_grid, submit_grid

    return submit_grid(load_grid(args.grid, args.root), args.executor, args.profile, args.parallel)


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


def _add_grid_parser(sub) -> None:
    from hybrid_lightning.grid.executor import EXECUTORS

    grid = sub.add_parser("grid", help="ablation grids: plan, submit (SLURM or local), status, cancel")
    actions = grid.add_subparsers(dest="grid_command", required=True, metavar="ACTION")

    def action(name: str, help: str, func) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help)
        p.add_argument("grid", help="grid file (YAML: base, axes, zip, exclude)")
        p.add_argument("--root", help="folder of the cells' run directories (default: the grid's root, else runs/<grid name>)")
        p.set_defaults(func=func)
        return p

    p = action("plan", "validate every cell and print them", cmd_grid_plan)
    p.add_argument("--json", action="store_true", help="the cells as a JSON list")
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--throughput", type=float, metavar="TOKENS_PER_S", help="training tokens per second per GPU, for GPU-hours")
    speed.add_argument("--tflops", type=float, metavar="TFLOPS",
                       help="sustained training TFLOP/s per GPU, for GPU-hours from each cell's FLOPs per token")
    p = action("submit", "submit the cells that are neither done nor live; resume the others", cmd_grid_submit)
    p.add_argument("--executor", choices=list(EXECUTORS), required=True,
                   help="; ".join(f"{name}: {cls.help}" for name, cls in EXECUTORS.items()))
    p.add_argument("--profile", help="SLURM profile: a YAML of submitit AutoExecutor parameters (slurm/*.yaml)")
    p.add_argument("--parallel", type=int, default=1, metavar="N", help="local executor: cells trained at once (default 1)")
    p = action("status", "one row per cell: state, step, loss, job, log", cmd_grid_status)
    p.add_argument("--json", action="store_true", help="the rows as a JSON list")
    p = action("cancel", "cancel the live jobs of the grid (or of the cells named)", cmd_grid_cancel)
    p.add_argument("cells", nargs="*", help="cell names (default: every cell)")


def cmd_probes(args: argparse.Namespace) -> int:
    from hybrid_lightning.eval.export import export_probes

    n = export_probes(args.out, args.tasks, args.lengths, args.samples, args.seed, args.value_tokens, args.tokenizer)
    print(f"{n} probes written to {args.out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from hybrid_lightning.export import export_run

    print(f"exported to {export_run(args.run_dir, args.out, args.ckpt, args.force, args.probes)}")
    return 0


def cmd_heads(args: argparse.Namespace) -> int:
    from hybrid_lightning.eval.ablation import parse_heads
    from hybrid_lightning.eval.heads_report import ablation_table, control_table, heads_path, heads_table, single_table
    from hybrid_lightning.offline import heads_checkpoint

    if args.mask_top is not None:
        selection, k = "top", args.mask_top
    elif args.mask_random is not None:
        selection, k = "random", args.mask_random
    else:
        selection, k = ("list" if args.mask else None), None
    report = heads_checkpoint(args.run_dir, args.ckpt, args.overrides, selection, k, parse_heads(args.mask or []), args.seed,
                              args.controls, args.mask_each)
    print(heads_table(report))
    if selection is not None:
        print(ablation_table({**report, "ablation": [r for r in report["ablation"] if r["selection"] == selection]}))
    for test in report.get("ablation_tests", []):
        print(control_table(test))
    if args.mask_each:
        print(single_table(report))
    print(f"written to {heads_path(args.run_dir, report['step'])}")
    return 0


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from hybrid_lightning.data.store import open_store

    print(open_store(_load(args).data, workers=args.workers, verify=True).summary())
    return 0


def cmd_data_tokenizer(args: argparse.Namespace) -> int:
    from hybrid_lightning.data.corpus import iter_documents
    from hybrid_lightning.data.tokenizer import train_bpe

    cfg = _load(args)
    tok = train_bpe(iter_documents(cfg.data), args.vocab_size, args.out)
    print(f"byte-level BPE of {tok.vocab_size} tokens written to {args.out} (use it with --set data.tokenizer={args.out})")
    return 0


def _add_data_parser(sub) -> None:
    data = sub.add_parser("data", help="token stores and tokenizers: prepare a corpus, train a BPE")
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    p = actions.add_parser("prepare", help="tokenize the config's corpus into its token store (resumes an interrupted one)")
    _add_config_args(p)
    p.add_argument("--workers", type=int, metavar="N", help="tokenizing processes (default: data.prepare_workers, else the cores, at most 8)")
    p.set_defaults(func=cmd_data_prepare)
    p = actions.add_parser("tokenizer", help="train a byte-level BPE on the config's corpus (tokenizers)")
    _add_config_args(p)
    p.add_argument("--vocab-size", type=int, required=True, metavar="N", help="vocabulary size, <|endoftext|> included")
    p.add_argument("--out", required=True, help="tokenizers JSON file to write")
    p.set_defaults(func=cmd_data_tokenizer)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybrid-lightning", description="Train and study hybrid (full + efficient attention) language models."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train (or resume) one run")
    _add_config_args(p)
    p.add_argument("--run-dir", help="run directory (default: runs/<name>)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="long-context evaluation of a run's checkpoint (writes eval/step_<k>.json)")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--ckpt", help="checkpoint file (default: the run's newest valid checkpoint)")
    p.add_argument("--lengths", nargs="+", metavar="N", help="probe lengths in tokens (default: the run's eval.lengths)")
    p.add_argument("--tasks", nargs="+", metavar="TASK", help="probe tasks (default: the run's eval.tasks)")
    p.add_argument("--set", action="append", default=[], metavar="eval.KEY=VALUE", dest="overrides",
                   help="override an eval.* setting, e.g. --set eval.samples=4 (repeatable)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("probes", help="write long-context probes as text documents (JSON lines), e.g. as training data")
    p.add_argument("tasks", nargs="+", metavar="TASK", help="probe tasks (as eval.tasks)")
    p.add_argument("--out", required=True, help="JSON-lines file to write")
    p.add_argument("--lengths", nargs="+", type=int, required=True, metavar="N", help="probe lengths in tokens")
    p.add_argument("--samples", type=int, default=100, help="probes per task and length, depths spread over [0, 1] (default 100)")
    p.add_argument("--seed", type=int, default=1, help="probe seed; keep it apart from the runs' eval.seed (default 1)")
    p.add_argument("--value-tokens", type=int, metavar="N", help="answers of at least N tokens (as eval.value_tokens)")
    p.add_argument("--tokenizer", default="byte", help="tokenizer the lengths count in (as data.tokenizer; default byte)")
    p.set_defaults(func=cmd_probes)

    p = sub.add_parser("heads", help="retrieval scores of every attention head of a run's checkpoint, and head "
                       "ablation (writes eval/heads_step_<k>.json)")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--ckpt", help="checkpoint file (default: the run's newest valid checkpoint)")
    mask = p.add_mutually_exclusive_group()
    mask.add_argument("--mask-top", type=int, metavar="K", help="mask the K heads with the highest retrieval score "
                      "and rerun the long-context evaluation (the run's eval.* probes)")
    mask.add_argument("--mask-random", type=int, metavar="K", help="mask K random heads outside the top K instead")
    mask.add_argument("--mask", nargs="+", metavar="LAYER.HEAD", help="mask these heads instead, e.g. --mask 3.0 3.2")
    p.add_argument("--seed", type=int, default=0, help="seed of --mask-random and of the control draws (default 0)")
    p.add_argument("--controls", type=int, default=20, metavar="N", help="with --mask-top: N random draws of as many heads "
                   "from the same layers, and the permutation p of the top K against them (default 20; 0 = none)")
    p.add_argument("--mask-each", action="store_true", help="also mask every attention head alone")
    p.add_argument("--set", action="append", default=[], metavar="eval.KEY=VALUE", dest="overrides",
                   help="override an eval.* setting, e.g. --set eval.heads.lengths=[2048] (repeatable)")
    p.set_defaults(func=cmd_heads)

    p = sub.add_parser("export", help="a run's checkpoint as a transformers model folder (AutoModelForCausalLM "
                       "with trust_remote_code=True, AutoTokenizer)")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--ckpt", help="checkpoint file (default: the run's newest valid checkpoint)")
    p.add_argument("--out", required=True, help="folder to write (must be empty or absent unless --force)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--probes", metavar="FILE", help="a 'hybrid-lightning probes' file: also write it as "
                   "lm-evaluation-harness tasks in OUT/lm_eval (lm_eval --include_path OUT/lm_eval --tasks hybrid_probes)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("params", help="per-layer parameter table and totals")
    _add_config_args(p)
    p.set_defaults(func=cmd_params)

    _add_grid_parser(sub)
    _add_data_parser(sub)
    _add_analysis_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # user errors: bad config, missing files; no traceback
        print(f"hybrid-lightning {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a folder without write permission: say what to do, no traceback
        if e.errno not in _ENVIRONMENT_ERRORS:
            raise
        print(f"hybrid-lightning {args.command}: error: {IOFailure.of(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
