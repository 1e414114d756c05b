"""The ``galvatron-fx`` command line: one sub-command per verb.

The arguments of every command are in :mod:`galvatron_fx.cli.commands` (no heavy imports, so
``--help`` answers at once); the code that runs a command is imported only when it runs.
``-v/--verbose`` works before or after the command name.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from galvatron_fx.cli.commands import COMMANDS


def _verbose(p: argparse.ArgumentParser, *, default) -> None:
    p.add_argument("-v", "--verbose", action="store_true", default=default, help="log at INFO level")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (imports no command's code)."""
    parser = argparse.ArgumentParser(
        prog="galvatron-fx",
        description="Automatic hybrid-parallel training for PyTorch models.",
    )
    _verbose(parser, default=False)
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, target) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        _verbose(p, default=argparse.SUPPRESS)  # after the command too; keeps a -v given before it
        add_arguments(p)
        p.set_defaults(_target=target)
    return parser


def version() -> str:
    """``galvatron-fx X (torch Y, Python Z)`` from the installed packages' metadata (no torch import)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    def of(name: str) -> str:
        try:
            return installed(name)
        except PackageNotFoundError:
            return "not installed"

    return f"galvatron-fx {of('galvatron_fx')} (torch {of('torch')}, Python {sys.version.split()[0]})"


def _runner(target: str):
    module_name, func = target.split(":")
    return getattr(importlib.import_module(module_name), func)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's arguments; ``train``'s ``--section.key value`` pairs (a run config's keys,
    :mod:`galvatron_fx.cli.run_config`) in ``args.overrides``. Nothing else unknown is accepted."""
    from galvatron_fx.cli.run_config import parse_overrides

    parser = build_parser()
    overrides, rest = parse_overrides(list(sys.argv[1:] if argv is None else argv))  # (before a positional takes a value)
    args = parser.parse_args(rest)
    if overrides and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join('--' + k for k, _ in overrides)} (--section.key: train only)")
    args.overrides = overrides
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from galvatron_fx.errors import GalvatronError

    try:
        return int(_runner(args._target)(args) or 0)
    except GalvatronError as e:  # user-facing errors carry their own advice
        print(f"galvatron-fx {args.command}: error: {e}", file=sys.stderr)
        return 2


def run_as_main() -> None:
    """``python -m galvatron_fx.cli`` (:mod:`galvatron_fx.cli.__main__`): :func:`main`, then exit."""
    code = main()
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        # a torchrun worker whose process groups are destroyed and files closed leaves without the
        # interpreter's and C++ libraries' teardown: a gloo or profiler thread still joinable at
        # static destruction aborts the process (SIGABRT) after a run that succeeded
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
