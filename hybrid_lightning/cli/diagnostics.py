"""The paper's diagnostics of a run's checkpoint: ``restrict`` (the long-context evaluation with layers limited to
their last R tokens), ``probe-layers`` (layer-wise probes) and ``gradient`` (gradient influence by distance). Each
writes its record in the run's ``eval/`` (records.DIAGNOSTICS) and prints a table."""

from __future__ import annotations

import argparse

from hybrid_lightning.cli.args import add_set, command


def _limits(args: argparse.Namespace) -> list[tuple[str, int]]:
    from hybrid_lightning.eval.restricted import parse_restriction

    return [parse_restriction(text) for text in args.limit or []]


def cmd_restrict(args: argparse.Namespace) -> int:
    from hybrid_lightning.eval.restricted import restricted_checkpoint, restricted_table
    from hybrid_lightning.rundir import eval_path

    record = restricted_checkpoint(args.run_dir, _limits(args), args.ckpt, args.overrides)
    print(restricted_table(record))
    print(f"written to {eval_path(args.run_dir, 'restricted', record['step'])}")
    return 0


def cmd_probe_layers(args: argparse.Namespace) -> int:
    from hybrid_lightning.eval.layer_probe import probe_checkpoint, probe_table
    from hybrid_lightning.rundir import eval_path

    record = probe_checkpoint(args.run_dir, _limits(args), args.ckpt, args.data, args.samples, args.length,
                              args.classes, args.seed, args.write_data, args.brief)
    print(probe_table(record))
    print(f"written to {eval_path(args.run_dir, 'layer_probe', record['step'])}")
    return 0


def cmd_gradient(args: argparse.Namespace) -> int:
    from hybrid_lightning.eval.gradient import gradient_checkpoint, gradient_table
    from hybrid_lightning.rundir import eval_path

    record, curves = gradient_checkpoint(args.run_dir, _limits(args), args.ckpt, args.texts, args.samples,
                                         args.context, args.last)
    print(gradient_table(record, curves))
    print(f"written to {eval_path(args.run_dir, 'gradient', record['step'])}")
    return 0


# Each command: what it does (its --help), the verb of its --limit help, and its own options (flag, add_argument's
# keywords).
COMMANDS = {
    "restrict": ("long-context evaluation with the full-attention or efficient layers limited to their last R tokens "
                 "(writes eval/restricted_step_<k>.json)", "evaluate", ()),
    "probe-layers": ("layer-wise probes: a logistic regression per layer reads the needle's value from the last token "
                     "(writes eval/layer_probe_step_<k>.json)", "probe", (
        ("--data", {"metavar": "JSON", "help": "a probe set in the authors' format (their 01_prepare_data.py's output, "
                        "or --write-data's); default: one made here"}),
        ("--samples", {"type": int, "default": 400, "help": "probes to make (default 400)"}),
        ("--length", {"type": int, "metavar": "N", "help": "their length in tokens (default: train.seq_len)"}),
        ("--classes", {"type": int, "default": 8, "help": "needle values, 2 to 8 (default 8)"}),
        ("--seed", {"type": int, "default": 42, "help": "seed of the probes made here (default 42)"}),
        ("--write-data", {"metavar": "JSON", "help": "write the probe set used, in the authors' format"}),
        ("--brief", {"action": "store_true", "help": "their needle and haystack without their instruction and long "
                     "question, for a model trained on contexts shorter than their prompt (docs/evaluation.md)"}))),
    "gradient": ("gradient influence: the norm of d(logits of the last 20 positions)/d(input embedding) by distance "
                 "to the last token (writes eval/gradient_step_<k>.json)", "measure", (
        ("--texts", {"metavar": "FILE", "help": "a .jsonl (fields input, prompt, text or context) or .txt file of "
                         "texts, as the authors' --dataset-path; default: held-out windows"}),
        ("--samples", {"type": int, "default": 16, "help": "texts (default 16)"}),
        ("--context", {"type": int, "metavar": "N", "help": "tokens per text (default: train.seq_len)"}),
        ("--last", {"type": int, "default": 20, "help": "positions whose logits are averaged (default 20)"}))),
}


def add_parsers(sub) -> None:
    """``restrict``, ``probe-layers`` and ``gradient`` (``COMMANDS``)."""
    funcs = {"restrict": cmd_restrict, "probe-layers": cmd_probe_layers, "gradient": cmd_gradient}
    for name, (text, verb, options) in COMMANDS.items():
        p = command(sub, name, text, "evaluation.md")
        p.add_argument("run_dir", help="run directory")
        p.add_argument("--ckpt", help="checkpoint file (default: the run's newest valid checkpoint)")
        p.add_argument("--limit", nargs="+", metavar="LAYERS:R", help=f"also {verb} with these layers (full or "
                       "efficient) limited to their last R tokens, beside the unrestricted model, e.g. --limit "
                       "full:2048 efficient:2048")
        for flag, kwargs in options:
            p.add_argument(flag, **kwargs)
        if name == "restrict":
            add_set(p, "override an eval.* setting", "eval.position_sequences=4", "eval.KEY=VALUE")
        p.set_defaults(func=funcs[name])
