"""Running ``aclarena`` in a fresh process and reading back what it imported.

Start-up cost is about which modules a command imports, so the tests look at ``sys.modules`` in a
new interpreter (the test process has imported everything already). The process runs in a scratch
folder, so a build folder of the checkout cannot shadow the installed entry points.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

_PROBE = """
import io, json, sys
report, stdin, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.stdin = io.StringIO(stdin)
from aclarena_slime.cli import main
try:
    rc = main(argv)
except SystemExit as exc:  # argparse's --help and usage errors
    rc = exc.code if isinstance(exc.code, int) else 1
sys.stdout.flush()
with open(report, "w") as f:
    json.dump({"rc": rc, "modules": sorted(sys.modules)}, f)
"""

HEAVY = ("torch", "transformers", "aiohttp", "numpy", "omegaconf", "hydra", "matplotlib", "peft", "megatron")


@dataclass
class CliRun:
    rc: int
    stdout: str
    stderr: str
    modules: set[str]

    def heavy(self) -> set[str]:
        """The heavy packages this run imported (top-level names)."""
        return {m.split(".")[0] for m in self.modules} & set(HEAVY)

    def plugins(self) -> set[str]:
        """The env plugin packages this run imported (``aclarena_envs.<name>``)."""
        return {".".join(m.split(".")[:2]) for m in self.modules if m.startswith("aclarena_envs.")}


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., CliRun]:
    def run(argv: Sequence[str], stdin: str = "", extra_path: Sequence[Path] = ()) -> CliRun:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([*map(str, extra_path), env.get("PYTHONPATH", "")]).strip(os.pathsep)
        report = tmp_path / "report.json"
        report.unlink(missing_ok=True)
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, str(report), stdin, *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert report.exists(), f"the probe died: {proc.stderr}"
        data = json.loads(report.read_text())
        return CliRun(data["rc"], proc.stdout, proc.stderr, set(data["modules"]))

    return run
