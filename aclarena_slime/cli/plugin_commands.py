"""Subcommands that plugins contribute through the entry-point group ``aclarena_slime.cli``.

A plugin declares, in its own pyproject::

    [project.entry-points."aclarena_slime.cli"]
    my-command = "my_pkg.cli:register"

where ``register(subparsers)`` adds the parser ``my-command`` (as the built-in command modules do).
``aclarena --help`` lists such commands by name without importing any plugin; only the command that
runs is imported. A plugin command that fails to load stops with an error that names the plugin and
says to reinstall it — a stale install is the usual cause.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import EntryPoint, entry_points

ENTRY_POINT_GROUP = "aclarena_slime.cli"


class PluginCommandError(Exception):
    """A plugin's command that cannot be set up; the message names the plugin and the fix."""


def plugin_entry_points() -> dict[str, list[EntryPoint]]:
    """Command name → its entry points (one, unless two installed packages claim the same name)."""
    found: dict[str, dict[str, EntryPoint]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, {})[ep.value] = ep  # the same package seen twice on sys.path counts once
    return {name: list(by_value.values()) for name, by_value in found.items()}


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    package = f", package {dist.metadata['Name']}" if dist is not None else ""
    return f"{ep.value}{package}"


def add_plugin_commands(subparsers: argparse._SubParsersAction, chosen: str | None) -> None:
    """Add every plugin command: ``chosen`` for real (imports its plugin), the others as names only."""
    builtin = set(subparsers.choices)
    for name, eps in sorted(plugin_entry_points().items()):
        if name in builtin:
            print(f"aclarena: ignoring plugin command {name!r} ({_origin(eps[0])}): a built-in command has that name",
                  file=sys.stderr)
            continue
        if name == chosen:
            _load(subparsers, name, eps)
        else:
            module = eps[0].value.partition(":")[0]
            subparsers.add_parser(name, help=f"from plugin {module} (`aclarena {name} --help` for more)")


def _load(subparsers: argparse._SubParsersAction, name: str, eps: list[EntryPoint]) -> None:
    if len(eps) > 1:
        origins = "; ".join(_origin(ep) for ep in eps)
        raise PluginCommandError(f"command {name!r} is declared by more than one plugin ({origins}); uninstall one")
    ep = eps[0]
    try:
        register = ep.load()
        register(subparsers)
    except Exception as exc:  # the plugin's own failure, reported with its name on it
        raise PluginCommandError(
            f"command {name!r} comes from plugin {_origin(ep)}, which failed to load: {exc!r}. "
            "Reinstall the package that provides it (in a checkout: pip install -e .)"
        ) from exc
    if name not in subparsers.choices:
        raise PluginCommandError(
            f"plugin {_origin(ep)} is registered for command {name!r} but its register() did not add it; "
            "its entry point and its parser disagree (reinstall after renaming a command)"
        )
