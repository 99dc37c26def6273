"""Installing on slime's image: every third-party module the package imports is declared, and the one
documented command adds what is missing without moving anything the image has (issue 15, defect 7)."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"aclarena_slime", "aclarena_envs", "envs"}
# Installed from their repositories, never from PyPI (PyPI's "slime" is an unrelated package).
FROM_REPOSITORY = {"slime"}
# Distributions of modules this venv may not have (their extras are not installed here).
NOT_INSTALLED_HERE = {"faiss": "faiss-cpu", "ray": "ray", "sglang": "sglang", "transformer_engine": "transformer-engine"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules() -> dict[str, set[str]]:
    """Top-level modules imported anywhere in the library and the env plugins (tests excluded)."""
    found: dict[str, set[str]] = {}
    for root in ("aclarena_slime", "envs"):
        for path in (REPO / root).rglob("*.py"):
            if "tests" in path.relative_to(REPO).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(REPO)))
    return found


def declared() -> set[str]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    return {_norm(re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0]) for req in requirements}


def test_every_third_party_import_is_declared():
    dists = importlib.metadata.packages_distributions()
    wanted = declared()
    missing = {}
    for module, files in imported_modules().items():
        if module in sys.stdlib_module_names or module in FIRST_PARTY or module in FROM_REPOSITORY:
            continue
        names = dists.get(module) or [NOT_INSTALLED_HERE.get(module, module)]
        if not any(_norm(name) in wanted for name in names):
            missing[module] = (names, sorted(files)[:2])
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"


def test_setup_slime_image_adds_only_what_is_missing_and_never_moves_torch(tmp_path: Path):
    """Against this venv (which, like the image, already has every dependency) the command plans to
    install our package only; asking it to change torch fails instead of changing it."""
    env = {**os.environ, "PYTHON": sys.executable}
    report = tmp_path / "report.json"
    base = ["bash", "launch/setup.sh", "--slime-image", "--dry-run", "--no-index", "--quiet"]
    done = subprocess.run([*base, "--report", str(report)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]] == ["aclarena-slime"]
    torch_version = importlib.metadata.version("torch")
    other = "2.4.0" if not torch_version.startswith("2.4.0") else "2.5.0"
    moved = subprocess.run([*base, f"torch=={other}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert moved.returncode != 0 and "torch" in moved.stderr


@pytest.mark.parametrize("module", sorted(FROM_REPOSITORY))
def test_repository_only_packages_are_not_declared(module: str):
    assert _norm(module) not in declared()  # PyPI's "slime" would shadow THUDM/slime
