"""The hook table: every hook resolves, takes the arguments slime passes, and only the edge imports slime."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from aclarena_slime.slime_edge import HOOKS, Hook, hook, path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "aclarena_slime"
EDGE = PACKAGE / "slime_edge"
# Tools that inspect an installed slime itself (its argument parsers, its loader on a dumped rollout, whether
# it imports at all, for the ``slime`` test marker): they run beside slime, never inside it.
SLIME_INSPECTORS = {
    PACKAGE / "launcher" / "preflight.py",
    PACKAGE / "launcher" / "smoke_report.py",
    PACKAGE / "testing" / "pytest_plugin.py",
}
# slime's DataSource interface (slime/rollout/data_source.py)
DATA_SOURCE_METHODS = ("get_samples", "add_samples", "save", "load", "__len__")
SOURCE_DIRS = ("aclarena_slime", "recipes", "tests", "envs", "benchmarks", "launch", "patches", "docs")
SUFFIXES = {".py", ".md", ".yaml", ".sh"}


def _resolve(dotted: str):
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _signature(target) -> inspect.Signature:
    return inspect.signature(target.__init__ if inspect.isclass(target) else target)


@pytest.mark.parametrize("entry", HOOKS, ids=lambda h: h.name)
def test_every_hook_resolves_and_takes_what_slime_passes(entry: Hook):
    target = _resolve(entry.path)
    assert entry.path.startswith("aclarena_slime.slime_edge.") and "." in entry.path  # slime's module.attr form
    signature = inspect.signature(target)  # a class: its constructor without self
    for positional, keywords in entry.calls:
        signature.bind(*positional, **dict.fromkeys(keywords))
    if inspect.isclass(target):
        for method in DATA_SOURCE_METHODS:
            assert callable(getattr(target, method, None)), f"{entry.name} lacks {method}"


def test_names_are_unique_and_lookups_name_the_known_ones():
    assert len({h.name for h in HOOKS}) == len(HOOKS)
    assert path("generate") == "aclarena_slime.slime_edge.rollout.generate"
    with pytest.raises(KeyError, match="known: generate"):
        hook("generat")


def _imports_slime(file: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        if any(name == "slime" or name.startswith("slime.") for name in names):
            lines.append(node.lineno)
    return lines


def test_nothing_outside_the_edge_imports_slime():
    offenders = {
        str(file.relative_to(REPO)): lines
        for file in PACKAGE.rglob("*.py")
        if EDGE not in file.parents and file not in SLIME_INSPECTORS and (lines := _imports_slime(file))
    }
    assert offenders == {}, "slime is imported outside aclarena_slime/slime_edge"
    assert _imports_slime(EDGE / "data_source.py"), "the check must see a real import"


def test_no_doc_or_recipe_names_a_hook_by_another_path():
    """A moved hook leaves no stale dotted path behind in recipes, docs or the fidelity table."""
    paths = {h.path for h in HOOKS}
    attrs = {p.rsplit(".", 1)[1] for p in paths}
    stale: dict[str, list[str]] = {}
    tracked = [REPO / "README.md", *(p for d in SOURCE_DIRS for p in (REPO / d).rglob("*") if p.suffix in SUFFIXES)]
    for file in tracked:
        if file == Path(__file__):
            continue
        for found in re.findall(r"aclarena_slime(?:\.[A-Za-z_]+)+", file.read_text(encoding="utf-8")):
            if found.rsplit(".", 1)[1] in attrs and found not in paths:
                stale.setdefault(str(file.relative_to(REPO)), []).append(found)
    assert stale == {}


@pytest.mark.slime
@pytest.mark.parametrize("entry", [h for h in HOOKS if h.reference], ids=lambda h: h.name)
def test_each_hook_has_the_signature_of_slimes_own_function_for_its_flag(entry: Hook):
    """Against the real slime: our hook accepts every parameter slime's default for the same flag takes,
    in the same places, and is a coroutine exactly when slime's is (slime awaits those)."""
    from slime.utils.misc import load_function

    ours, theirs = load_function(entry.path), load_function(entry.reference)
    assert ours is _resolve(entry.path)
    if inspect.isclass(theirs):
        assert inspect.isclass(ours)
        for method in ("__init__", *DATA_SOURCE_METHODS):
            _same_parameters(getattr(ours, method), getattr(theirs, method), f"{entry.name}.{method}")
        return
    _same_parameters(ours, theirs, entry.name)
    assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(theirs), entry.name


def _same_parameters(ours, theirs, name: str) -> None:
    mine = list(inspect.signature(ours).parameters.values())
    accepts_any_keyword = any(p.kind is p.VAR_KEYWORD for p in mine)
    by_name = {p.name: p for p in mine}
    for index, param in enumerate(inspect.signature(theirs).parameters.values()):
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.kind is param.POSITIONAL_OR_KEYWORD:
            assert index < len(mine) and mine[index].name == param.name, (
                f"{name}: parameter {index} is not {param.name}"
            )
        elif param.default is param.empty:  # a required keyword slime passes
            assert param.name in by_name or accepts_any_keyword, f"{name}: does not accept {param.name}="
