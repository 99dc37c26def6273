"""``aclarena``: the user's handle on everything that is not a training run.

Each module in this package that defines ``register(subparsers)`` contributes one subcommand, so a
new command is a new file. Shared style: ``--help`` says what the command is for, ``--json`` prints
JSON on stdout, errors go to stderr with a non-zero exit.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys


class CommandError(Exception):
    """A user-facing failure: printed as one line on stderr, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aclarena", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except CommandError as exc:
        print(f"aclarena {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
