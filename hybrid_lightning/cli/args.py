"""What the commands share: a subcommand naming its docs page, the config arguments (``CONFIG --set KEY=VALUE``)
and the config they give."""

from __future__ import annotations

import argparse

from hybrid_lightning.config import RunConfig, load_config


def command(sub, name: str, help: str, page: str) -> argparse.ArgumentParser:
    """A subcommand whose --help says what it does and names its page under docs/."""
    return sub.add_parser(name, help=help, description=f"{help[0].upper()}{help[1:]}. Documented in docs/{page}.")


def add_set(p: argparse.ArgumentParser, what: str = "override a config value", example: str = "model.window=128",
            metavar: str = "KEY=VALUE") -> None:
    p.add_argument("--set", action="append", default=[], metavar=metavar, dest="overrides",
                   help=f"{what}, e.g. --set {example} (repeatable)")


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="run config YAML (default: the embedded default)")
    add_set(p)


def load(args: argparse.Namespace) -> RunConfig:
    return load_config(args.config, args.overrides)
