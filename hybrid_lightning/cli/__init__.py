"""The ``hybrid-lightning`` command line: the parsers of every command (``run``: one run; ``grid``: grids;
``analysis``: folders of runs; ``scaling``: a table of sizes x budgets) and ``main``. Nothing heavy is imported
until a command runs, and then only what it needs: ``--help``, ``--version``, ``train --print-config``, ``grid
status``, ``grid cancel``, ``analyze``'s argument errors, ``pack`` and ``scaling`` load neither torch nor Lightning
(tests/test_imports.py, tests/test_scaling.py)."""

from __future__ import annotations

import argparse
import errno
import os
import sys

from hybrid_lightning import __version__
from hybrid_lightning.cli import analysis, diagnostics, grid, run, scaling
from hybrid_lightning.cli.analysis import demo_grid
from hybrid_lightning.fileio import IOFailure
from hybrid_lightning.interpreter import interpreting, patch

__all__ = ["build_parser", "demo_grid", "main"]

# OSErrors of the machine rather than of the code: reported in one line with what to do.
_ENVIRONMENT_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO}


class _Parser(argparse.ArgumentParser):
    """A parser whose usage errors are one line on stderr (exit 2) pointing at ``--help``, as every other refusal
    is; its subcommands' parsers are of this class too (``add_subparsers`` takes the parent's class)."""

    _inner = False  # inside parse_known_intermixed_args, which calls parse_known_args itself (before Python 3.13)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        """A command's positionals and options in any order (``grid cancel GRID --root R CELL``): a parser without
        subcommands reads its arguments intermixed."""
        if self._inner or self._subparsers is not None:
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hybrid-lightning", description="Train and study hybrid (full + efficient attention) language models. "
        "Start with README.md; the reference is in docs/ (docs/configuration.md for every config key).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run.add_parsers(sub)
    diagnostics.add_parsers(sub)
    grid.add_parsers(sub)
    analysis.add_parsers(sub)
    scaling.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    name = " ".join(filter(None, (args.command, getattr(args, "grid_command", None))))  # the command that refuses
    try:
        if interpreting():  # TRITON_INTERPRET=1: fla's kernels on CPU, Triton patched once, at the start
            patch()
    except RuntimeError as e:  # versions the patches were not tested with
        print(f"hybrid-lightning {name}: error: {e}", file=sys.stderr)
        return 2
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader gone early (`| head`) is then the BrokenPipeError below
        return code
    except BrokenPipeError:  # the reader went away (`grid plan --json | head`): no traceback, no flush error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports it
    except ValueError as e:  # user errors: bad config, missing files; no traceback
        print(f"hybrid-lightning {name}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a folder without write permission: say what to do, no traceback
        if e.errno not in _ENVIRONMENT_ERRORS:
            raise
        print(f"hybrid-lightning {name}: error: {IOFailure.of(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
