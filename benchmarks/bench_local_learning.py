"""Does the default local profile learn? Held-out reward before, after the warm start, after GRPO, per env.

    python benchmarks/bench_local_learning.py [--envs math search ifeval] [--out runs/bench_local_learning]
                                              [OVERRIDE ...]   e.g. cluster.local.warm_start_steps=100

Each env's stage recipe runs as ``bash launch/stage.sh RECIPE`` runs it on the local backend (the
``cluster=local`` profile, its SFT warm start on gold demo trajectories, then GRPO), one after the
other in this process. Columns: the mean reward on the held-out demo prompts (never trained on) of the
base model, of the warm-started backbone and of the GRPO-trained expert; whether the last beats the
first (the issue's bar); the share of gold demos the env scored as correct and kept; the warm start's
training loss (first -> last tenth of its steps); wall and CPU seconds of the stage (set-up — imports, the tiny model — excluded
from neither: it is a second or two). On a shared machine wall time is inflated; CPU seconds are not.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aclarena_slime.local.spec import local_config
from aclarena_slime.local.stage import run_stage
from aclarena_slime.recipes.compose import load_recipe

REPO = Path(__file__).resolve().parents[1]
RECIPES = {"math": "stage1_math", "search": "stage2_search", "ifeval": "stage4_if"}


def cpu_seconds() -> float:
    """User + system seconds of this process and its finished children (the math verifier's workers)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def reward(metrics: dict, key: str) -> str:
    value = (metrics.get(key) or {}).get("mean_reward")
    return "-" if value is None else f"{value:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--out", default="runs/bench_local_learning", help="folder for the stages' outputs")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. rollout.num_rollout=4")
    args = parser.parse_args()
    table = Table(title="local profile: held-out mean reward (greedy)")
    columns = ("env", "held-out n", "base", "warm start", "after GRPO", "rise", "demos kept", "SFT loss", "wall s", "CPU s")
    for column in columns:
        table.add_column(column, justify="right")
    for env in args.envs:
        recipe = load_recipe(
            REPO / "recipes" / f"{RECIPES[env]}.yaml",
            ["cluster=local", f"paths.root={Path(args.out).resolve()}", *args.overrides],
        )
        cfg = local_config(recipe)
        wall, cpu = time.perf_counter(), cpu_seconds()
        metrics = run_stage(cfg)
        wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
        warm = metrics.get("warm_start") or {}
        demos, sft = warm.get("demos") or {}, warm.get("sft") or {}
        before, after = (metrics[key]["mean_reward"] for key in ("eval_before", "eval_after"))
        table.add_row(
            env,
            str(metrics["eval_after"]["n"]),
            *(reward(metrics, key) for key in ("eval_before", "eval_warm_start", "eval_after")),
            "yes" if before is not None and after is not None and after > before else "NO",
            f"{demos.get('kept', 0)}/{demos.get('replayed', 0)}" if demos else "-",
            f"{sft['loss_first']:.2f}->{sft['loss_last']:.2f}" if sft else "-",
            f"{wall:.0f}",
            f"{cpu:.0f}",
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
