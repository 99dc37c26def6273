"""launch/setup.sh reinstalls when its inputs change, the script itself included."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_setup_reruns_when_the_script_itself_changes(tmp_path):
    for name in ("pyproject.toml", "setup.py", "launch/setup.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    calls = tmp_path / "calls.log"
    fake_python = tmp_path / ".venv/bin/python"  # records what setup.sh asks of it instead of installing
    fake_python.parent.mkdir(parents=True)
    fake_python.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake_python.chmod(0o755)

    def installs() -> int:
        subprocess.run(["bash", str(tmp_path / "launch/setup.sh")], check=True, capture_output=True, timeout=60)
        n = calls.read_text().count("pip install") if calls.exists() else 0
        calls.unlink(missing_ok=True)
        return n

    assert installs() == 3  # pip itself, torch, the package
    assert installs() == 0, "nothing changed: the stamp matches"
    with (tmp_path / "launch/setup.sh").open("a") as f:
        f.write("# a changed pin\n")
    assert installs() == 3
