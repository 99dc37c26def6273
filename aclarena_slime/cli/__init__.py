"""``aclarena``: the user's handle on everything that is not a training run.

Each module in this package that defines ``register(subparsers)`` contributes one subcommand, so a
new command is a new file. Plugins contribute theirs through the entry-point group
``aclarena_slime.cli`` (name = command, value = ``module:register``), loaded only when that command
runs (see :mod:`aclarena_slime.cli.plugin_commands`). Shared style: ``--help`` says what the command
is for, ``--json`` prints JSON on stdout, errors go to stderr with a non-zero exit.

Start-up time is part of the interface (``aclarena score`` is run once per response by plugin
authors): a command module imports only the standard library and light modules at the top, and
anything heavy (torch, transformers, aiohttp, numpy, OmegaConf/Hydra, matplotlib, env plugins)
inside the handler that needs it. ``tests/cli/test_startup.py`` holds the line.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys


class CommandError(Exception):
    """A user-facing failure: printed as one line on stderr, exit status 2."""


def _chosen_command(argv: list[str]) -> str | None:
    """The subcommand named on the command line: the first word that is not an option.

    The top-level parser has no option that takes a value, so this is exact; it lets a plugin's
    command be imported only when it is the one that runs.
    """
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; of the plugins' commands only ``chosen`` is loaded, the rest are listed by name."""
    from aclarena_slime.cli.plugin_commands import add_plugin_commands

    parser = argparse.ArgumentParser(prog="aclarena", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(subparsers)
    add_plugin_commands(subparsers, chosen)
    return parser


def main(argv: list[str] | None = None) -> int:
    from aclarena_slime.cli.plugin_commands import PluginCommandError

    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = _chosen_command(argv)
    try:
        parser = build_parser(chosen)
    except PluginCommandError as exc:
        print(f"aclarena: {exc}", file=sys.stderr)
        return 2
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if chosen is not None and chosen not in commands:
        print(
            f"aclarena: no command {chosen!r} (commands: {', '.join(commands)}). A plugin's command appears once "
            "its package is installed; after adding one to a pyproject, reinstall it (in a checkout: pip install -e .)",
            file=sys.stderr,
        )
        return 2
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except CommandError as exc:
        print(f"aclarena {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
