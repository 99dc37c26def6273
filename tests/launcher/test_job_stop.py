"""A launcher that stops waiting for its Ray job stops the job: killing ``ray job submit`` leaves it training."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from aclarena_slime.launcher import ray_job, stage
from aclarena_slime.recipes.compose import load_recipe

REPO = Path(__file__).resolve().parents[2]

# The ray CLI, logged: a head answers; a submitted job trains until it is stopped.
FAKE_RAY = """#!/usr/bin/env bash
echo "$*" >> "{log}"
if [ "$1 $2" = "job submit" ]; then exec sleep 30; fi
exit 0
"""


def _interrupt_once_submitted(log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if log.exists() and "job submit" in log.read_text():
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C; a curriculum's SIGTERM takes the same way out
            return
        time.sleep(0.02)


def test_an_interrupted_stage_stops_its_ray_job(tmp_path: Path, monkeypatch):
    log, script = tmp_path / "ray.log", tmp_path / "ray"
    script.write_text(FAKE_RAY.format(log=log))
    script.chmod(0o755)
    monkeypatch.setattr(ray_job, "_ray", lambda: str(script))
    monkeypatch.setattr(ray_job, "require_gpus", lambda ray, want: want)  # every node joined
    recipe = load_recipe(REPO / "recipes/stage1_math.yaml", [f"paths.root={tmp_path}"])
    threading.Thread(target=_interrupt_once_submitted, args=(log,), daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        stage._run_slime(recipe)
    lines = log.read_text().splitlines()
    submitted = next(line for line in lines if line.startswith("job submit"))
    submission = next(a.split("=", 1)[1] for a in submitted.split() if a.startswith("--submission-id="))
    dashboard = next(a for a in submitted.split() if a.startswith("--address="))
    assert lines[-1] == f"job stop {dashboard} {submission}"


def test_a_job_that_ends_is_not_stopped(tmp_path: Path, monkeypatch):
    calls: list[tuple[list[str], str]] = []
    monkeypatch.setattr(ray_job, "submit", lambda argv, submission: calls.append((list(argv), submission)) or 0)
    monkeypatch.setattr(ray_job, "stop_job", lambda *a, **k: pytest.fail(f"a job that ended is not stopped: {a}"))
    argv = ["ray", "job", "submit", "--address=http://127.0.0.1:8265", "--", "python"]
    assert stage.submit_watched(argv, "http://127.0.0.1:8265", "s1", []) == (0, None)
    assert calls[0][0] == argv and calls[0][1].startswith("aclarena-s1-")


# launch/stage.sh's process (python -m aclarena_slime.launcher.stage), with this machine's stand-ins: a GPU node,
# an HF export that exists; the Ray CLI is the fake above, first on PATH.
STAGE = """
import sys
from aclarena_slime.launcher import ray_job, stage
from aclarena_slime.launcher.backend import BackendChoice
import aclarena_slime.launcher.hf_export as hf_export
stage.choose_backend = lambda requested: BackendChoice("slime", "a GPU node")
hf_export.ensure_export = lambda recipe: None
ray_job.require_gpus = lambda ray, want: want
raise SystemExit(stage.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGHUP])
def test_a_stage_launcher_terminated_stops_its_ray_job(tmp_path: Path, how):
    """SIGTERM (a scheduler's cancel, ``kill``) or SIGHUP (a closed terminal) take Ctrl-C's way out: the Ray job
    is stopped. Before: the launcher died at once and its job trained on."""
    import subprocess
    import sys

    bin_dir, log = tmp_path / "bin", tmp_path / "ray.log"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(FAKE_RAY.format(log=log))
    (bin_dir / "ray").chmod(0o755)
    script = tmp_path / "stage_main.py"
    script.write_text(STAGE)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    argv = [sys.executable, str(script), "recipes/stage1_math.yaml", "backend=slime", "cluster=single_8",
            f"paths.root={tmp_path}"]  # fmt: skip
    stderr = tmp_path / "stderr.log"  # a file, not a pipe: the fake job (its sleep) would hold a pipe open
    with stderr.open("w") as err_file:
        launcher = subprocess.Popen(argv, cwd=REPO, env=env, stderr=err_file)
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and "job submit" in log.read_text()) and time.monotonic() < deadline:
            assert launcher.poll() is None, stderr.read_text()
            time.sleep(0.05)
        launcher.send_signal(how)
        launcher.wait(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    err = stderr.read_text()
    assert launcher.returncode == 128 + how, err[-2000:]
    lines = log.read_text().splitlines()
    submitted = next(line for line in lines if line.startswith("job submit"))
    submission = next(a.split("=", 1)[1] for a in submitted.split() if a.startswith("--submission-id="))
    assert lines[-1].startswith("job stop ") and lines[-1].endswith(submission), lines
    assert f"stopping its job {submission}" in err
