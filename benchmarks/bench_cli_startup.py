"""Cold start of the ``aclarena`` CLI: fresh processes, median of N runs.

    .venv/bin/python benchmarks/bench_cli_startup.py [--runs 7]

Times ``aclarena --help`` and ``aclarena score math`` (a response on stdin), each a new process as a
user starts it, beside the interpreter's own start (``python -c pass``) and ``import torch`` (what
the score path used to load). Then, from ``python -X importtime`` of the score path, the heaviest
top-level imports (cumulative, median over the runs). Aim: both commands under one second. Numbers
on a shared machine are noisy; the tests in ``tests/cli/test_startup.py`` hold the cause in place
(which modules each command imports) without timing anything.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

SCORE_ARGS = ["score", "math", "--label", '"73"']
SCORE_STDIN = "so the answer is \\boxed{073}"
# What the console script runs (pip writes the same two lines into bin/aclarena).
ENTRY = "import sys; from aclarena_slime.cli import main; sys.exit(main())"


def aclarena_command() -> list[str]:
    """The installed console script beside this interpreter, else the module."""
    script = Path(sys.executable).parent / "aclarena"
    return [str(script)] if script.exists() else [sys.executable, "-m", "aclarena_slime"]


def cold_start(cmd: list[str], stdin: str, runs: int, cwd: str) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=cwd)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return times


def top_level_imports(stderr: str) -> dict[str, float]:
    """Cumulative seconds of each top-level import in ``-X importtime`` output (nested ones folded in)."""
    out: dict[str, float] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|")
        if len(name) - len(name.lstrip()) == 1:  # one space: imported by the program, not by another module
            out[name.strip()] = out.get(name.strip(), 0.0) + int(cumulative) / 1e6
    return out


def heaviest_imports(runs: int, cwd: str, top: int) -> tuple[list[tuple[str, float]], float]:
    per_module: dict[str, list[float]] = defaultdict(list)
    totals = []
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", ENTRY, *SCORE_ARGS],
            input=SCORE_STDIN,
            capture_output=True,
            text=True,
            cwd=cwd,
        )
        seconds = top_level_imports(proc.stderr)
        totals.append(sum(seconds.values()))
        for name, value in seconds.items():
            per_module[name].append(value)
    medians = sorted(((n, statistics.median(v)) for n, v in per_module.items()), key=lambda x: -x[1])
    return medians[:top], statistics.median(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per row (median reported)")
    parser.add_argument("--top", type=int, default=3, help="heaviest imports of the score path to list")
    args = parser.parse_args()

    aclarena = aclarena_command()
    rows = [
        ("python -c pass (interpreter start)", [sys.executable, "-c", "pass"], ""),
        ("python -c 'import torch' (for scale)", [sys.executable, "-c", "import torch"], ""),
        ("aclarena --help", [*aclarena, "--help"], ""),
        ("aclarena score math (stdin)", [*aclarena, *SCORE_ARGS], SCORE_STDIN),
    ]
    with tempfile.TemporaryDirectory() as cwd:  # away from the checkout: its build folders cannot shadow the install
        table = Table(title=f"aclarena cold start — {args.runs} fresh processes each (seconds)")
        for column in ("what", "median", "min", "max"):
            table.add_column(column, justify="left" if column == "what" else "right")
        for label, cmd, stdin in rows:
            times = cold_start(cmd, stdin, args.runs, cwd)
            table.add_row(label, f"{statistics.median(times):.3f}", f"{min(times):.3f}", f"{max(times):.3f}")
        heaviest, total = heaviest_imports(args.runs, cwd, args.top)

    imports = Table(title=f"aclarena score math: heaviest top-level imports (-X importtime, all imports {total:.3f} s)")
    imports.add_column("module")
    imports.add_column("cumulative s (median)", justify="right")
    for name, seconds in heaviest:
        imports.add_row(name, f"{seconds:.3f}")
    console = Console()
    console.print(table)
    console.print(imports)


if __name__ == "__main__":
    main()
