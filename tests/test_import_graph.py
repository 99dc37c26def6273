"""The package's import graph: no circles between modules, no arrow from a lower layer up to a higher one.

The graph is read statically (ast), with every import counted wherever it stands: at the top,
inside a function (a lazy import is still a dependency) or under ``TYPE_CHECKING``. An edge goes
to the module imported, or to the package when a name comes from its ``__init__``. The layer order
below is the design's (docs/ and the design notes): formats and clients at the bottom, the env
contract, the shared rollout, evaluation, the slime edge and recipes, the two backends' runner
and dispatcher, the curriculum (it runs stages through the launcher, and reaches no backend but through
it), the arena (it runs the local backend itself) and the CLI on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "aclarena_slime"

# Lowest first. A unit is a subpackage of aclarena_slime or one of its top-level modules; a unit
# may import units of its own layer or below.
LAYERS: list[set[str]] = [
    {
        "__init__",
        "jsonl",
        "chat_tokens",
        "sample",
        "http_service",
        "experts",
        "tis",
        "kl",
        "sglang_client",
        "sglang_errors",
        "adapter_swap",
        "worker_pool",
        "dotted",
    },  # formats, clients, shared loss math (tis, kl; adapter_swap: the one way an engine's adapters change; dotted: the one path loader)
    {"plugin"},  # the env contract, registry and conformance kit
    {"agent_loop", "rollout", "group_rewards", "rollout_guard", "parity"},  # the one shared rollout; engine vs trainer log-probs
    {"lora", "router", "distill"},
    {"evaluation", "analysis"},  # suites, the runner, the forgetting monitor; tables and plots
    {"slime_edge"},  # every function slime loads by dotted path (the monitor's eval hook among them)
    {"recipes"},  # the stage spec, its compiler (which writes the eval suite as --eval-config) and lineage
    {"local"},  # the local backend
    {"launcher", "testing"},  # picks a backend and runs a stage on it; the pytest plugin and slime-side doubles
    {"curriculum"},  # writes recipe sections, runs stages through the launcher
    {"arena"},  # methods over one shared base, which it builds and evaluates on the local backend
    {"cli", "__main__"},
]
BACKENDS = ("aclarena_slime.local",)  # what the curriculum never imports
# The one door from the curriculum to a backend: the stage launcher runs the stage on the backend it chose.
STAGE_DISPATCH = "aclarena_slime.launcher.stage"


def modules(root: Path, name: str) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's ``__init__``), for every ``.py`` below ``root`` (imported as ``name``)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = [name, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph(root: Path, name: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in the file)."""
    known = modules(root, name)

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in known.items():
        here = name if is_package else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(owner(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets.update(owner(f"{source}.{alias.name}") for alias in node.names)
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def unit(module: str) -> str:
    """The subpackage or top-level module a module belongs to (``__init__`` for the package itself)."""
    return module.split(".")[1] if "." in module else "__init__"


def layer_of(module: str) -> int:
    for level, units in enumerate(LAYERS):
        if unit(module) in units:
            return level
    raise AssertionError(f"{module}: its unit {unit(module)!r} is in no layer; add it to LAYERS")


GRAPH = import_graph(PACKAGE, "aclarena_slime")


def test_no_import_circles():
    found = circles(GRAPH)
    edges = [f"{a} -> {b}" for c in found for a in c for b in sorted(GRAPH[a] & set(c))]
    assert not found, "import circles:\n  " + "\n  ".join(edges)


def test_no_upward_arrows():
    upward = [
        f"{a} ({unit(a)}) -> {b} ({unit(b)})"
        for a in sorted(GRAPH)
        for b in sorted(GRAPH[a])
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "imports from a lower layer up to a higher one:\n  " + "\n  ".join(upward)


def test_the_curriculum_imports_no_backend():
    found = [
        f"{a} -> {b}"
        for a in sorted(GRAPH)
        if unit(a) == "curriculum"
        for b in sorted(GRAPH[a])
        if b.startswith(BACKENDS)
    ]
    assert not found, "the curriculum imports a backend:\n  " + "\n  ".join(found)


def reached(graph: dict[str, set[str]], start: str, door: str) -> dict[str, str]:
    """Every module ``start`` reaches (module -> the module that imports it on the way), not through ``door``."""
    seen, todo = {start: ""}, [start]
    while todo:
        here = todo.pop()
        for there in sorted(graph.get(here, ())):
            if there not in seen and there != door:
                seen[there] = here
                todo.append(there)
    return seen


def test_the_curriculum_reaches_no_backend_but_through_the_stage_launcher():
    """Not only no import: no chain of imports (a re-export on the way, as the arena's base once was) reaches
    the local backend, except the stage launcher's dispatch, which runs a stage on the backend it chose."""
    found = []
    for start in sorted(m for m in GRAPH if unit(m) == "curriculum"):
        seen = reached(GRAPH, start, STAGE_DISPATCH)
        for module in sorted(m for m in seen if m.startswith(BACKENDS)):
            chain = [module]
            while seen[chain[-1]]:
                chain.append(seen[chain[-1]])
            found.append(" <- ".join(chain))
            break
    assert not found, "the curriculum reaches a backend:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("env", sorted(p.name for p in (REPO / "envs").iterdir() if (p / "__init__.py").exists()))
def test_no_import_circles_in_an_env_plugin(env):
    graph = import_graph(REPO / "envs" / env, f"aclarena_envs.{env}")
    found = circles(graph)
    edges = [f"{a} -> {b}" for c in found for a in c for b in sorted(graph[a] & set(c))]
    assert not found, f"import circles in envs/{env}:\n  " + "\n  ".join(edges)


def test_the_graph_reader_sees_lazy_and_relative_imports(tmp_path):
    """The reader itself: a circle made of a lazy import and a relative one is found, and named."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("from .. import a\n")
    graph = import_graph(package, "pkg")
    assert graph["pkg"] == set() and graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert circles(graph) == [["pkg.a", "pkg.sub.b"]]
