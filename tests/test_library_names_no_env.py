"""The library names no environment: what it must know about an env, the plugin contributes.

A tag in the library's code (a string, a help text, an import of an env package) means a new env has to
edit the library, and that an env's name is baked into it. Docstrings and comments may name the paper's
envs as examples; code may not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

LIBRARY = Path(__file__).resolve().parent.parent / "aclarena_slime"
TAGS = ("math", "search", "retail", "ifeval")
# A tag as a word, not inside markup such as "<search>" (a protocol's tag, which the hostile-turn corpus
# and the tiny tokenizer's vocabulary use) nor part of a longer name ("math-verify", "research").
TAG_WORD = re.compile(rf"(?<![<\w/-])({'|'.join(TAGS)})(?![>\w-])")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def env_names_in(source: str) -> list[str]:
    """Each place ``source`` names an env in code: ``line: text``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if TAG_WORD.search(node.value) or "aclarena_envs" in node.value:
                hits.append((node.lineno, repr(node.value[:80])))
        elif isinstance(node, ast.Import):
            hits += [(node.lineno, f"import {a.name}") for a in node.names if a.name.startswith("aclarena_envs")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aclarena_envs"):
            hits.append((node.lineno, f"from {node.module} import ..."))
    return [f"{line}: {text}" for line, text in sorted(hits)]


def test_the_check_finds_what_it_looks_for():
    source = '''"""A docstring may say math."""
import math  # the standard module
from aclarena_envs.search.env import SearchEnvironment
TAGS = ("retail", "x")
HELP = "environment tag (math, search, ...)"
MARKUP = "<search> q </search>", "math-verify", "research"
'''
    assert [hit.split(":")[0] for hit in env_names_in(source)] == ["3", "4", "5"]


def test_no_library_file_names_an_env_tag():
    found = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        relative = path.relative_to(LIBRARY).as_posix()
        if hits := env_names_in(path.read_text()):
            found[relative] = hits
    assert not found, f"library files name an env tag in code (move it into the env plugin): {found}"
