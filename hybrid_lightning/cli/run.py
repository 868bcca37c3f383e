"""The commands of one run: ``train`` (with ``--print-config`` and ``--dry-run``), ``params``, ``eval``,
``heads``, ``trace``, ``probes``, ``export`` and ``data``. Each imports what it needs when it runs: ``--print-config``
loads neither torch nor Lightning, ``params`` and ``--dry-run`` torch (they count parameters on blocks built
on the meta device and estimate memory on fake tensors) but not Lightning."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hybrid_lightning.cli.args import add_config_args, add_set, command, load
from hybrid_lightning.config import dump_config
from hybrid_lightning.rundir.status import read_status


def add_preview_args(p: argparse.ArgumentParser) -> None:
    preview = p.add_mutually_exclusive_group()  # either prints and exits; nothing is written
    preview.add_argument("--print-config", action="store_true",
                         help="print the resolved config as YAML (train reads it)")
    preview.add_argument("--dry-run", action="store_true",
                         help="print parameters, tokens, steps and a time estimated here")


def cmd_train(args: argparse.Namespace) -> int:
    from hybrid_lightning.plan.resolve import resolve_config

    cfg = load(args)  # a bad key or value is refused here, before torch or Lightning is imported
    if args.print_config:
        print(dump_config(resolve_config(cfg)))
        return 0
    if args.dry_run:
        from hybrid_lightning.plan.resolve import param_table
        from hybrid_lightning.training.dryrun import dry_run_report
        from hybrid_lightning.training.preflight import preflight

        cfg, plan, run_dir = preflight(cfg, args.run_dir)  # what train would refuse, refused here
        print(param_table(plan))
        print(dry_run_report(cfg, plan, run_dir))
        return 0
    from hybrid_lightning.training.run import train
    from hybrid_lightning.training.stop import Stopped, stop_message

    try:
        run_dir = train(cfg, args.run_dir, planned=_planned(args.planned), ends_process=True)
    except Stopped as e:  # SIGTERM / SIGINT: the step reached is saved (a second signal ends the process at once)
        print(stop_message(e.signum, e.step), file=sys.stderr)
        return 128 + e.signum
    status = read_status(run_dir) or {}
    if status.get("state") == "interrupted":
        print(f"{run_dir}: stopped at step {status.get('step')}; run the same command again to resume")
    return 0


def _planned(path: str | None) -> dict | None:
    """``--planned``: the plan a grid recorded when it submitted the run (plan.json's layout)."""
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--planned {path}: not a readable run plan ({e})") from None


def cmd_params(args: argparse.Namespace) -> int:
    from hybrid_lightning.plan.resolve import param_table, plan_run

    print(param_table(plan_run(load(args))[1]))
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
    from hybrid_lightning.heads.offline import heads_checkpoint
    from hybrid_lightning.heads.report import ablation_table, control_table, heads_path, heads_table, single_table

    if args.mask_top is not None:
        selection, k = "top", args.mask_top
    elif args.mask_random is not None:
        selection, k = "random", args.mask_random
    else:
        selection, k = ("list" if args.mask else None), None
    report = heads_checkpoint(args.run_dir, args.ckpt, args.overrides, selection, k, parse_heads(args.mask or []),
                              args.seed, args.controls, args.mask_each, args.mask_mode)
    print(heads_table(report))
    if selection is not None:
        print(ablation_table({**report, "ablation": [r for r in report["ablation"] if r["selection"] == selection]}))
    for test in report.get("ablation_tests", []):
        print(control_table(test))
    if args.mask_each:
        print(single_table(report))
    print(f"written to {heads_path(args.run_dir, report['step'])}")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from hybrid_lightning.heads.ablation import parse_heads
    from hybrid_lightning.heads.tracing import trace_run, trace_table
    from hybrid_lightning.rundir import TRACING_DIR

    traced = trace_run(args.run_dir, args.niah, args.top, args.max_samples, args.max_tokens, args.reference,
                       parse_heads(args.heads or []))
    print(trace_table(traced))
    print(f"written to {Path(args.run_dir) / TRACING_DIR}/step_<k>.json ({len(traced)} checkpoints)")
    return 0


def cmd_data_prepare(args: argparse.Namespace) -> int:
    from hybrid_lightning.data.store import open_store

    print(open_store(load(args).data, workers=args.workers, verify=True).summary())
    return 0


def cmd_data_tokenizer(args: argparse.Namespace) -> int:
    from hybrid_lightning.data.corpus import iter_documents
    from hybrid_lightning.data.tokenizer import train_bpe

    cfg = load(args)
    tok = train_bpe(iter_documents(cfg.data), args.vocab_size, args.out)
    print(f"byte-level BPE of {tok.vocab_size} tokens written to {args.out} (use it with --set "
          f"data.tokenizer={args.out})")
    return 0


def add_parsers(sub) -> None:
    """``train``, ``eval``, ``probes``, ``heads``, ``trace``, ``export``, ``params`` and ``data``."""
    p = command(sub, "train", "train (or resume) one run", "training.md")
    add_config_args(p)
    p.add_argument("--run-dir", help="run directory (default: runs/<name>)")
    p.add_argument("--planned", metavar="PLAN_JSON", help="the run plan made where the run was submitted (a grid "
                   "cell's .grid/cells/<cell>.plan.json); a plan made here that differs is refused")
    add_preview_args(p)
    p.set_defaults(func=cmd_train)

    p = command(sub, "eval", "long-context evaluation of a run's checkpoint (writes eval/step_<k>.json)",
                "evaluation.md")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--ckpt", help="checkpoint file (default: the run's newest valid checkpoint)")
    p.add_argument("--lengths", nargs="+", metavar="N",
                   help="probe lengths in tokens (default: the run's eval.lengths)")
    p.add_argument("--tasks", nargs="+", metavar="TASK", help="probe tasks (default: the run's eval.tasks)")
    add_set(p, "override an eval.* setting", "eval.samples=4", "eval.KEY=VALUE")
    p.set_defaults(func=cmd_eval)

    p = command(sub, "probes", "write long-context probes as text documents (JSON lines), e.g. as training data",
                "evaluation.md")
    p.add_argument("tasks", nargs="+", metavar="TASK", help="probe tasks (as eval.tasks)")
    p.add_argument("--out", required=True, help="JSON-lines file to write")
    p.add_argument("--lengths", nargs="+", type=int, required=True, metavar="N", help="probe lengths in tokens")
    p.add_argument("--samples", type=int, default=100,
                   help="probes per task and length, depths spread over [0, 1] (default 100)")
    p.add_argument("--seed", type=int, default=1, help="probe seed; keep it apart from the runs' eval.seed (default 1)")
    p.add_argument("--value-tokens", type=int, metavar="N", help="answers of at least N tokens (as eval.value_tokens)")
    p.add_argument("--tokenizer", default="byte",
                   help="tokenizer the lengths count in (as data.tokenizer; default byte)")
    p.set_defaults(func=cmd_probes)

    _add_heads_parser(sub)
    _add_trace_parser(sub)

    p = command(sub, "export", "a run's checkpoint as a transformers model folder (AutoModelForCausalLM "
                "with trust_remote_code=True, AutoTokenizer)", "export.md")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--ckpt", help="checkpoint file (default: the run's newest valid checkpoint)")
    p.add_argument("--out", required=True, help="folder to write (must be empty or absent unless --force)")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--probes", metavar="FILE", help="a 'hybrid-lightning probes' file: also write it as "
                   "lm-evaluation-harness tasks in OUT/lm_eval (lm_eval --include_path OUT/lm_eval --tasks "
                   "hybrid_probes)")
    p.set_defaults(func=cmd_export)

    p = command(sub, "params", "per-layer parameter table and totals", "training.md")
    add_config_args(p)
    p.set_defaults(func=cmd_params)
    _add_data_parser(sub)


def _add_heads_parser(sub) -> None:
    p = command(sub, "heads", "retrieval scores of every attention head of a run's checkpoint, and head "
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
                   "non-retrieval heads of the same layers and N of non-retrieval heads of any layer, seeded by "
                   "--seed, the run and the step, and the permutation p of the top K against each "
                   "(default 20; 0 = none)")
    p.add_argument("--mask-mode", choices=["zero", "uniform"], default="zero",
                   help="zero: a masked head's output is 0; "
                   "uniform: its pre-softmax logits are 0, so it attends uniformly (Wu et al.) (default zero)")
    p.add_argument("--mask-each", action="store_true", help="also mask every attention head alone")
    add_set(p, "override an eval.* setting", "eval.heads.lengths=[2048]", "eval.KEY=VALUE")
    p.set_defaults(func=cmd_heads)


def _add_trace_parser(sub) -> None:
    p = command(sub, "trace", "retrieval heads by attention mass on a run's final checkpoint, traced back over its "
                "kept checkpoints by attention entropy and Q/K weight distance (writes tracing/step_<k>.json)",
                "evaluation.md")
    p.add_argument("run_dir", help="run directory")
    p.add_argument("--niah", required=True, metavar="JSONL", help="needle-in-a-haystack rows with 'input' (the "
                   "prompt) and 'outputs' (its answers), as RULER writes them")
    p.add_argument("--top", type=int, default=4, metavar="K", help="target heads: the K of highest attention mass "
                   "over all layers of the final checkpoint (default 4)")
    p.add_argument("--heads", nargs="+", metavar="LAYER.HEAD", help="trace these heads instead of the top K")
    p.add_argument("--max-samples", type=int, default=200, metavar="N", help="the first N rows (default 200)")
    p.add_argument("--max-tokens", type=int, default=8192, metavar="N",
                   help="prompts cut to their first N tokens (default 8192)")
    p.add_argument("--reference", metavar="CKPT", help="checkpoint of the Q/K distances (default: the oldest kept)")
    p.set_defaults(func=cmd_trace)


def _add_data_parser(sub) -> None:
    data = command(sub, "data", "token stores and tokenizers: prepare a corpus, train a BPE", "training.md")
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    p = command(actions, "prepare", "tokenize the config's corpus into its token store (resumes an interrupted one)",
                "training.md")
    add_config_args(p)
    p.add_argument("--workers", type=int, metavar="N",
                   help="tokenizing processes (default: data.prepare_workers, else the cores, at most 8)")
    p.set_defaults(func=cmd_data_prepare)
    p = command(actions, "tokenizer", "train a byte-level BPE on the config's corpus (tokenizers)", "training.md")
    add_config_args(p)
    p.add_argument("--vocab-size", type=int, required=True, metavar="N", help="vocabulary size, <|endoftext|> included")
    p.add_argument("--out", required=True, help="tokenizers JSON file to write")
    p.set_defaults(func=cmd_data_tokenizer)
