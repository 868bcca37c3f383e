"""The ``hybrid-lightning`` command line."""

from __future__ import annotations

import argparse
import errno
import importlib.resources
import os
import sys
from pathlib import Path

from hybrid_lightning import __version__
from hybrid_lightning.config import RunConfig, dump_config, load_config
from hybrid_lightning.cli_grid import add_grid_parsers
from hybrid_lightning.fileio import IOFailure
from hybrid_lightning.interpreter import interpreting, patch
from hybrid_lightning.rundir import read_status

# OSErrors of the machine rather than of the code: reported in one line with what to do.
_ENVIRONMENT_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO}


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


def _add_preview_args(p: argparse.ArgumentParser) -> None:
    preview = p.add_mutually_exclusive_group()  # either prints and exits; nothing is written
    preview.add_argument("--print-config", action="store_true", help="print the resolved config as YAML (train reads it)")
    preview.add_argument("--dry-run", action="store_true", help="print parameters, tokens, steps and a time estimated here")


def cmd_train(args: argparse.Namespace) -> int:
    from hybrid_lightning.plan.resolve import default_run_dir, param_table, plan_run, resolve_config
    from hybrid_lightning.training.dryrun import dry_run_report
    from hybrid_lightning.training.run import train
    from hybrid_lightning.training.stop import Stopped

    if args.print_config:
        print(dump_config(resolve_config(_load(args))))
        return 0
    if args.dry_run:
        cfg, plan = plan_run(_load(args))
        print(param_table(plan))
        print(dry_run_report(cfg, plan, Path(args.run_dir or default_run_dir(cfg))))
        return 0
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
    from hybrid_lightning.plan.resolve import param_table, plan_run

    print(param_table(plan_run(_load(args))[1]))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from hybrid_lightning.eval.offline import evaluate_checkpoint
    from hybrid_lightning.eval.report import report_path, table

    overrides = list(args.overrides)
    for key, values in (("tasks", args.tasks), ("lengths", args.lengths)):
        if values:
            overrides.append(f"eval.{key}=[{','.join(values)}]")
    report = evaluate_checkpoint(args.run_dir, args.ckpt, overrides)
    print(table(report))
    print(f"written to {report_path(args.run_dir, report['step'])}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from hybrid_lightning.analysis.report import analyze

    planned = None
    if args.grid is not None:
        from hybrid_lightning.grid import load_grid

        planned = [(c.name, c.run_dir) for c in load_grid(args.grid, args.dir, resolve=False).cells]  # its data need not exist
    report = analyze(args.dir, args.out, args.metric, planned, findings=args.findings)
    if args.findings:
        print((report.parent / "findings.md").read_text())
    print(f"report written to {report}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from hybrid_lightning.analysis.report import analyze
    from hybrid_lightning.grid import load_grid, submit_grid

    grid = load_grid(args.grid or demo_grid(), args.root)
    code = submit_grid(grid, "local", parallel=args.parallel)
    planned = [(c.name, c.run_dir) for c in grid.cells]
    print(f"report.md and findings.md written to {analyze(grid.root, args.out, planned=planned, findings=True).parent}")
    return code


def _add_analysis_parsers(sub) -> None:
    from hybrid_lightning.analysis.metrics import METRICS

    p = _command(sub, "analyze", "figures, CSV tables and report.md from a folder of runs (a grid root or any)", "analysis.md")
    p.add_argument("dir", help="folder searched recursively for run directories (folders with config.yaml; .grid/ skipped)")
    p.add_argument("--out", help="output folder (default: DIR/analysis)")
    p.add_argument("--metric", choices=list(METRICS), default="token_acc",
                   help="long-context score (default token_acc: answer-token accuracy minus chance)")
    p.add_argument("--grid", help="the grid file of DIR: the report lists its cells that have no run directory")
    p.add_argument("--findings", action="store_true",
                   help="open the report with rule-based verdicts on the paper's three findings (analysis/findings.py)")
    p.set_defaults(func=cmd_analyze)

    from hybrid_lightning.analysis.pack import add_parsers

    add_parsers(sub, _command)

    p = _command(sub, "demo", "train a demo grid locally, then analyse it (grid submit --executor local + analyze --findings)", "analysis.md")
    p.add_argument("--grid", help="grid file (default: ablations/demo.yaml, installed with the package)")
    p.add_argument("--root", help="folder of the cells' run directories (default: runs/<grid name>)")
    p.add_argument("--parallel", type=int, default=2, metavar="N", help="cells trained at once (default 2)")
    p.add_argument("--out", help="analysis output folder (default: <root>/analysis)")
    p.set_defaults(func=cmd_demo)


def cmd_probes(args: argparse.Namespace) -> int:
    from hybrid_lightning.probes.files import export_probes

    n = export_probes(args.out, args.tasks, args.lengths, args.samples, args.seed, args.value_tokens, args.tokenizer)
    print(f"{n} probes written to {args.out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from hybrid_lightning.export import export_run

    print(f"exported to {export_run(args.run_dir, args.out, args.ckpt, args.force, args.probes)}")
    return 0


def cmd_heads(args: argparse.Namespace) -> int:
    from hybrid_lightning.heads.ablation import parse_heads
    from hybrid_lightning.heads.report import ablation_table, control_table, heads_path, heads_table, single_table
    from hybrid_lightning.heads.offline import heads_checkpoint

    if args.mask_top is not None:
        selection, k = "top", args.mask_top
    elif args.mask_random is not None:
        selection, k = "random", args.mask_random
    else:
        selection, k = ("list" if args.mask else None), None
    report = heads_checkpoint(args.run_dir, args.ckpt, args.overrides, selection, k, parse_heads(args.mask or []), args.seed,
                              args.controls, args.mask_each, args.mask_mode)
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
    data = _command(sub, "data", "token stores and tokenizers: prepare a corpus, train a BPE", "training.md")
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    p = _command(actions, "prepare", "tokenize the config's corpus into its token store (resumes an interrupted one)", "training.md")
    _add_config_args(p)
    p.add_argument("--workers", type=int, metavar="N", help="tokenizing processes (default: data.prepare_workers, else the cores, at most 8)")
    p.set_defaults(func=cmd_data_prepare)
    p = _command(actions, "tokenizer", "train a byte-level BPE on the config's corpus (tokenizers)", "training.md")
    _add_config_args(p)
    p.add_argument("--vocab-size", type=int, required=True, metavar="N", help="vocabulary size, <|endoftext|> included")
    p.add_argument("--out", required=True, help="tokenizers JSON file to write")
    p.set_defaults(func=cmd_data_tokenizer)


def _command(sub, name: str, help: str, page: str) -> argparse.ArgumentParser:
    """A subcommand whose --help says what it does and names its page under docs/."""
    return sub.add_parser(name, help=help, description=f"{help[0].upper()}{help[1:]}. Documented in docs/{page}.")


def _add_heads_parser(sub) -> None:
    p = _command(sub, "heads", "retrieval scores of every attention head of a run's checkpoint, and head "
                 "ablation (writes eval/heads_step_<k>.json)", "evaluation.md")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--ckpt", help="checkpoint file (default: the run's newest valid checkpoint)")
    mask = p.add_mutually_exclusive_group()
    mask.add_argument("--mask-top", type=int, metavar="K", help="mask the K heads with the highest retrieval score "
                      "and rerun the long-context evaluation (the run's eval.* probes)")
    mask.add_argument("--mask-random", type=int, metavar="K", help="mask K random heads outside the top K instead")
    mask.add_argument("--mask", nargs="+", metavar="LAYER.HEAD", help="mask these heads instead, e.g. --mask 3.0 3.2")
    p.add_argument("--seed", type=int, default=0, help="seed of --mask-random and of the control draws (default 0)")
    p.add_argument("--controls", type=int, default=20, metavar="N", help="with --mask-top: N random draws of as many "
                   "non-retrieval heads of the same layers and N of non-retrieval heads of any layer, seeded by --seed, the "
                   "run and the step, and the permutation p of the top K against each (default 20; 0 = none)")
    p.add_argument("--mask-mode", choices=["zero", "uniform"], default="zero", help="zero: a masked head's output is 0; "
                   "uniform: its pre-softmax logits are 0, so it attends uniformly (Wu et al.) (default zero)")
    p.add_argument("--mask-each", action="store_true", help="also mask every attention head alone")
    p.add_argument("--set", action="append", default=[], metavar="eval.KEY=VALUE", dest="overrides",
                   help="override an eval.* setting, e.g. --set eval.heads.lengths=[2048] (repeatable)")
    p.set_defaults(func=cmd_heads)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybrid-lightning", description="Train and study hybrid (full + efficient attention) language models. "
        "Start with README.md; the reference is in docs/ (docs/configuration.md for every config key).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _command(sub, "train", "train (or resume) one run", "training.md")
    _add_config_args(p)
    p.add_argument("--run-dir", help="run directory (default: runs/<name>)")
    _add_preview_args(p)
    p.set_defaults(func=cmd_train)

    p = _command(sub, "eval", "long-context evaluation of a run's checkpoint (writes eval/step_<k>.json)", "evaluation.md")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--ckpt", help="checkpoint file (default: the run's newest valid checkpoint)")
    p.add_argument("--lengths", nargs="+", metavar="N", help="probe lengths in tokens (default: the run's eval.lengths)")
    p.add_argument("--tasks", nargs="+", metavar="TASK", help="probe tasks (default: the run's eval.tasks)")
    p.add_argument("--set", action="append", default=[], metavar="eval.KEY=VALUE", dest="overrides",
                   help="override an eval.* setting, e.g. --set eval.samples=4 (repeatable)")
    p.set_defaults(func=cmd_eval)

    p = _command(sub, "probes", "write long-context probes as text documents (JSON lines), e.g. as training data", "evaluation.md")
    p.add_argument("tasks", nargs="+", metavar="TASK", help="probe tasks (as eval.tasks)")
    p.add_argument("--out", required=True, help="JSON-lines file to write")
    p.add_argument("--lengths", nargs="+", type=int, required=True, metavar="N", help="probe lengths in tokens")
    p.add_argument("--samples", type=int, default=100, help="probes per task and length, depths spread over [0, 1] (default 100)")
    p.add_argument("--seed", type=int, default=1, help="probe seed; keep it apart from the runs' eval.seed (default 1)")
    p.add_argument("--value-tokens", type=int, metavar="N", help="answers of at least N tokens (as eval.value_tokens)")
    p.add_argument("--tokenizer", default="byte", help="tokenizer the lengths count in (as data.tokenizer; default byte)")
    p.set_defaults(func=cmd_probes)

    _add_heads_parser(sub)

    p = _command(sub, "export", "a run's checkpoint as a transformers model folder (AutoModelForCausalLM "
             "with trust_remote_code=True, AutoTokenizer)", "export.md")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--ckpt", help="checkpoint file (default: the run's newest valid checkpoint)")
    p.add_argument("--out", required=True, help="folder to write (must be empty or absent unless --force)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--probes", metavar="FILE", help="a 'hybrid-lightning probes' file: also write it as "
                   "lm-evaluation-harness tasks in OUT/lm_eval (lm_eval --include_path OUT/lm_eval --tasks hybrid_probes)")
    p.set_defaults(func=cmd_export)

    p = _command(sub, "params", "per-layer parameter table and totals", "training.md")
    _add_config_args(p)
    p.set_defaults(func=cmd_params)

    add_grid_parsers(sub, _command, _add_preview_args)
    _add_data_parser(sub)
    _add_analysis_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if interpreting():  # TRITON_INTERPRET=1: fla's kernels on CPU, Triton patched once, at the start
            patch()
    except RuntimeError as e:  # versions the patches were not tested with
        print(f"hybrid-lightning {args.command}: error: {e}", file=sys.stderr)
        return 2
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader gone early (`| head`) is then the BrokenPipeError below
        return code
    except BrokenPipeError:  # the reader went away (`grid plan --json | head`): no traceback, no flush error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports it
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
