"""Plugin commands through the entry-point group ``aclarena_slime.cli``, found by the real importlib.metadata.

Each test installs a small package the way pip does (a module plus a ``*.dist-info`` folder with its
``entry_points.txt``) into a scratch folder on ``PYTHONPATH`` and runs ``aclarena`` in a new process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aclarena_slime.cli import build_parser
from aclarena_slime.cli.plugin_commands import ENTRY_POINT_GROUP, plugin_entry_points

_GREETER = '''
import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("hello", help="say hello", description="Greets NAME.")
    parser.add_argument("--name", required=True)
    parser.set_defaults(handler=lambda args: print(f"hello {args.name}"))
'''


def install(root: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str] | None = None) -> Path:
    """A package as pip leaves it in site-packages: its modules and a dist-info with entry points."""
    root.mkdir(parents=True, exist_ok=True)
    for name, source in (modules or {}).items():
        (root / f"{name}.py").write_text(source)
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")
    return root


def test_a_plugin_command_is_listed_unloaded_and_runs_when_chosen(run_cli, tmp_path):
    site = install(tmp_path / "site", "greeter", {"hello": "greeter_cli:register"}, {"greeter_cli": _GREETER})
    listing = run_cli(["--help"], extra_path=[site])
    assert listing.rc == 0 and "hello" in listing.stdout
    assert "greeter_cli" not in listing.modules, "--help must not import a plugin's command"
    run = run_cli(["hello", "--name", "ada"], extra_path=[site])
    assert (run.rc, run.stdout) == (0, "hello ada\n")
    assert "Greets NAME." in run_cli(["hello", "--help"], extra_path=[site]).stdout


def test_a_plugin_that_fails_to_load_names_itself_and_says_to_reinstall(run_cli, tmp_path):
    site = install(tmp_path / "site", "stale", {"broken": "stale_cli_gone:register"})
    run = run_cli(["broken", "--x"], extra_path=[site])
    assert run.rc == 2
    assert "'broken'" in run.stderr and "stale_cli_gone:register" in run.stderr and "package stale" in run.stderr
    assert "Reinstall" in run.stderr and "Traceback" not in run.stderr
    # the broken plugin spoils nothing else
    assert run_cli(["--help"], extra_path=[site]).rc == 0
    assert run_cli(["score", "--help"], extra_path=[site]).rc == 0


def test_an_entry_point_whose_register_adds_another_name_is_an_error(run_cli, tmp_path):
    site = install(tmp_path / "site", "renamed", {"greet": "renamed_cli:register"}, {"renamed_cli": _GREETER})
    run = run_cli(["greet"], extra_path=[site])
    assert run.rc == 2 and "did not add it" in run.stderr and "renamed_cli:register" in run.stderr


def test_two_plugins_claiming_one_command_is_an_error_naming_both(run_cli, tmp_path):
    one = install(tmp_path / "one", "one", {"hello": "greeter_cli:register"}, {"greeter_cli": _GREETER})
    two = install(tmp_path / "two", "two", {"hello": "other_cli:register"}, {"other_cli": _GREETER})
    run = run_cli(["hello", "--name", "x"], extra_path=[one, two])
    assert run.rc == 2
    assert "greeter_cli:register" in run.stderr and "other_cli:register" in run.stderr


def test_a_built_in_command_keeps_its_name_and_the_clash_is_reported(run_cli, tmp_path):
    site = install(tmp_path / "site", "squatter", {"score": "greeter_cli:register"}, {"greeter_cli": _GREETER})
    run = run_cli(["score", "--help"], extra_path=[site])
    assert run.rc == 0 and "--label" in run.stdout
    assert "ignoring plugin command 'score'" in run.stderr and "greeter_cli" not in run.modules


def test_an_unknown_command_lists_the_commands_and_says_a_plugin_needs_installing(run_cli):
    run = run_cli(["frobnicate", "--x"])
    assert run.rc == 2
    assert "'frobnicate'" in run.stderr and "score" in run.stderr and "reinstall" in run.stderr


@pytest.mark.parametrize("command", sorted(plugin_entry_points()))
def test_every_installed_plugin_command_loads_and_registers_its_name(command):
    """The in-repo plugins' lines in pyproject.toml point at real register() functions."""
    parser = build_parser(command)
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert command in subparsers.choices
    loaded = subparsers.choices[command]
    assert loaded.prog == f"aclarena {command}" and loaded.description, "the plugin's own parser, not the listing stub"


def test_the_in_repo_plugins_contribute_their_commands():
    assert {"retail", "serve-retriever"} <= set(plugin_entry_points())
