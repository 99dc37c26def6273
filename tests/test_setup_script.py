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


def test_two_setups_started_together_on_a_fresh_clone_build_one_venv(tmp_path):
    """Two launch/stage.sh runs on a fresh clone: one builds .venv aside and moves it into place, under a lock;
    the other waits and finds it ready. Neither sees a half-built .venv, and none is left half-built."""
    for name in ("pyproject.toml", "setup.py", "launch/setup.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    calls = tmp_path / "calls.log"
    # The base python: `-m venv DIR` makes DIR/bin/python, a fake whose pip installs record themselves, slowly
    # (so the second setup starts while the first is still building).
    base = tmp_path / "python3"
    base.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "Python 3.fake"; exit 0; fi\n'
        f'if [ "$1 $2" = "-m venv" ]; then echo "venv $3" >> {calls}; mkdir -p "$3/bin"\n'
        f'  printf \'#!/bin/sh\\necho "$0 $*" >> {calls}; sleep 0.3\\n\' > "$3/bin/python"; chmod +x "$3/bin/python"; fi\n'
    )
    base.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(base)}
    runs = [
        subprocess.Popen(["bash", str(tmp_path / "launch/setup.sh")], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for run in runs:
        assert run.wait(timeout=60) == 0, run.stderr.read()
    log = calls.read_text().splitlines()
    assert sum(line.startswith("venv ") for line in log) == 1  # one venv built ...
    assert sum("pip install" in line for line in log) == 3  # ... and installed once: pip, torch, the package
    built = next(line.split()[1] for line in log if line.startswith("venv "))
    assert Path(built).name.startswith(".venv.building-")  # aside, then moved into place
    assert (tmp_path / ".venv/bin/python").is_file() and (tmp_path / ".venv/.aclarena-setup").is_file()
    assert not list(tmp_path.glob(".venv.building-*"))
