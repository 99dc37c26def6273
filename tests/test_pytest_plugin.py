"""The pytest plugin loads from the installed package (entry point ``pytest11``), for plugin authors too.

Each check runs pytest in a folder outside this repository (no conftest.py, no pyproject.toml of ours),
as a plugin author's own package would, on pytest-asyncio's strict mode (its default).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

AUTHOR_TESTS = '''import pytest

def test_loaded_from_the_entry_point(pytestconfig):
    assert pytestconfig.pluginmanager.get_plugin("aclarena_slime") is not None

def test_fixture(tiny_checkpoint):
    assert (tiny_checkpoint / "tokenizer.json").is_file()

@pytest.mark.slime
def test_marker_is_known():
    pass

@pytest.mark.asyncio
async def test_async():
    assert True
'''


def _pytest(folder: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers", *extra]
    argv += ["-o", "asyncio_mode=strict", "-o", "asyncio_default_fixture_loop_scope=function", "test_author.py"]
    return subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=300)


def test_plugin_loads_from_the_installed_package_under_asyncio_strict_mode(tmp_path):
    (tmp_path / "test_author.py").write_text(AUTHOR_TESTS)
    result = _pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout  # the slime test is skipped here unless slime imports
    off = _pytest(tmp_path, "-p", "no:aclarena_slime")
    assert off.returncode != 0 and "'slime' not found in `markers` configuration option" in off.stdout
