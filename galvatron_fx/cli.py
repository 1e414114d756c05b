"""The ``galvatron-fx`` command line: one sub-command per verb.

Each sub-command lives next to the code it drives and registers itself here through
``_COMMANDS``; this module only parses arguments and dispatches.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

# name -> (module path, function adding the sub-parser, function running it)
_COMMANDS: dict[str, str] = {
    "inspect": "galvatron_fx.inspect",
    "profile": "galvatron_fx.profiler.hardware",
    "plan": "galvatron_fx.search.cli",
    "lower": "galvatron_fx.lower_cli",
}


def _load(module_name: str):
    import importlib

    return importlib.import_module(module_name)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser; each command module provides ``add_arguments(parser)``."""
    parser = argparse.ArgumentParser(
        prog="galvatron-fx",
        description="Automatic hybrid-parallel training for PyTorch models.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module_name in _COMMANDS.items():
        mod = _load(module_name)
        p = sub.add_parser(name, help=mod.CLI_HELP, description=mod.CLI_HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run_cli)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    run: Callable[[argparse.Namespace], int] = args._run
    try:
        return int(run(args) or 0)
    except Exception as e:  # user-facing errors carry their own advice
        from galvatron_fx.errors import GalvatronError

        if isinstance(e, GalvatronError):
            print(f"galvatron-fx {args.command}: error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
