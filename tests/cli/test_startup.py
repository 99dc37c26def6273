"""The CLI starts fast: what a command imports, checked in a fresh process (no timing here).

``benchmarks/bench_cli_startup.py`` prints the seconds; these tests hold the cause in place: neither
``aclarena --help`` nor ``aclarena score`` imports torch or the other heavy libraries, and a command
imports only the env plugin it needs.
"""

from __future__ import annotations

import json

import pytest

from aclarena_slime.cli.plugin_commands import plugin_entry_points


def test_help_lists_every_command_without_importing_heavy_libraries_or_plugins(run_cli):
    run = run_cli(["--help"])
    assert run.rc == 0
    for name in plugin_entry_points():
        assert name in run.stdout
    assert "score" in run.stdout and "serve-router" in run.stdout
    assert run.heavy() == set(), f"aclarena --help imported {sorted(run.heavy())}"
    assert run.plugins() == set(), f"aclarena --help imported plugins {sorted(run.plugins())}"


def test_score_imports_neither_torch_nor_other_plugins(run_cli):
    run = run_cli(["score", "math", "--label", '"73"'], stdin="so the answer is \\boxed{073}")
    assert run.rc == 0, run.stderr
    assert json.loads(run.stdout)["reward"] == 1.0
    assert "torch" not in run.modules
    assert run.heavy() == set(), f"aclarena score math imported {sorted(run.heavy())}"
    assert run.plugins() == {"aclarena_envs.math"}


@pytest.mark.parametrize("command", sorted(plugin_entry_points()))
def test_a_plugin_command_imports_its_plugin_only_and_nothing_heavy_for_help(run_cli, command):
    run = run_cli([command, "--help"])
    assert run.rc == 0, run.stderr
    assert f"aclarena {command}" in run.stdout
    assert run.heavy() == set(), f"aclarena {command} --help imported {sorted(run.heavy())}"
    (ep,) = plugin_entry_points()[command]
    owner = ".".join(ep.value.partition(":")[0].split(".")[:2])
    assert run.plugins() == {owner}


def test_serve_router_help_names_the_header_the_router_reads():
    from aclarena_slime.cli import serve_router
    from aclarena_slime.router.routing import TAG_HEADER

    assert serve_router.TAG_HEADER == TAG_HEADER
