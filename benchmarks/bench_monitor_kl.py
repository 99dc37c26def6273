"""What RL's Razor's predictor adds to the forgetting monitor on the local backend.

    .venv/bin/python benchmarks/bench_monitor_kl.py [--steps 4] [--threads 1]

Runs one local GRPO stage on the tiny model (the learnable env, watching one earlier domain, a check after
every step) twice: the monitor with its evaluated scores only (``kl: false``, the anchor: what a user gets
without the predictor) and with the KL to the stage's starting policy (``kl: true``, the default). Prints,
per run, the checks, the seconds the monitor spent, the stage's wall and CPU seconds, and the KL curve;
a one-step stage runs first, unmeasured, so neither run pays the first imports.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aclarena_slime.local.stage import run_stage
from aclarena_slime.plugin import registry
from aclarena_slime.testing.local import LEARNABLE, local_session


def stage(out: Path, steps: int, threads: int, kl: bool) -> dict[str, Any]:
    session = local_session(
        out, *LEARNABLE, f"rollout.num_rollout={steps}", "rollout.rollout_batch_size=4", "rollout.n_samples_per_prompt=8",
        "rollout.rollout_max_response_len=8", "++cluster.local.eval_size=0", "algorithm.lr=5e-2",
        f"++cluster.local.torch_threads={threads}", "++cluster.local.progress=false", "++monitor.enabled=true",
        "++monitor.domains=[mock]", "++monitor.interval=1", "++monitor.demo_size=8", "++monitor.max_response_len=8",
        "++monitor.max_drop=100.0", f"++monitor.kl={str(kl).lower()}",
    )  # fmt: skip
    started, cpu = time.monotonic(), time.process_time()
    metrics = run_stage(session)
    return {**metrics["monitor"], "wall": time.monotonic() - started, "cpu": time.process_time() - cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    from aclarena_envs.learnable.env import LearnableEnvironment

    registry.register("learnable", LearnableEnvironment)
    table = Table(title=f"forgetting monitor on the local backend: {args.steps} steps, a check after each")
    for column in ("monitor", "checks", "monitor s", "stage wall s", "stage CPU s", "KL by check (mock)"):
        table.add_column(column)
    with tempfile.TemporaryDirectory() as tmp:
        stage(Path(tmp) / "warm_up", 1, args.threads, True)  # imports (PEFT, the engine) and caches: not measured
        for kl in (False, True):
            run = stage(Path(tmp) / f"kl_{kl}", args.steps, args.threads, kl)
            curve = " ".join(f"{value:.4f}" for _, value in run["kl"].get("mock", []))
            table.add_row("scores + KL" if kl else "scores only (anchor)", str(len(run["curves"]["mock"])),
                          f"{run['seconds']:.1f}", f"{run['wall']:.1f}", f"{run['cpu']:.1f}", curve or "-")  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
