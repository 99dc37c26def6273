"""The pytest plugin works for plugin authors on pytest-asyncio's strict mode (its default)."""

from __future__ import annotations

import subprocess
import sys


def test_plugin_runs_under_asyncio_strict_mode(tmp_path):
    (tmp_path / "test_author.py").write_text(
        "import pytest\n\n"
        "def test_sync():\n    assert True\n\n"
        "@pytest.mark.asyncio\nasync def test_async():\n    assert True\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=strict"]
        + [
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "-p",
            "aclarena_slime.testing.pytest_plugin",
            "test_author.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
