"""Does GRPO learn on the local profile? Held-out reward of the base model, the warm start and GRPO, per env, over seeds.

    python benchmarks/bench_local_learning.py [--seeds 3] [--envs math search ifeval] [--retail-data DIR]
                                              [--out runs/bench_local_learning] [--jobs N] [OVERRIDE ...]
                                              e.g. rollout.num_rollout=8

Each env's stage recipe runs as ``bash launch/stage.sh RECIPE`` runs it on the local backend (the
``cluster=local`` profile: the SFT warm start on gold demo trajectories, then GRPO), once per seed
(``cluster.local.seed``, 0 .. N-1), one after the other in this process (``--jobs N``: N at a time, each
in its own process). Per env the table shows the
mean reward on the held-out demo prompts (never trained on; evaluated as the profile says: ``k`` samples per
prompt at the rollout temperature, the authors' evaluation) of the base model, of the warm-started
backbone and of the GRPO-trained policy, and GRPO's gain over the warm start, each as the mean ± the
spread (half the range) over the seeds; GRPO's gain on the greedy reward of the same prompts; the mean
sampled rollout reward of the first and the last two GRPO steps, GRPO's gain on the validation prompts (``cluster.local.validation_size``, carved out of
the RL records: what the profile's settings were chosen on; this benchmark evaluates them, the main command does not), and the CPU and wall seconds of one stage
(mean; set-up — the tiny model, its tokenizer — included; a warm start reused from an earlier run in the same ``--out`` folder is not: ``warm_start_cached``
in the JSON). On a shared machine wall time is inflated; CPU seconds are not. ``--retail-data DIR`` adds
the τ³-Retail stage on that data folder (no warm start: retail has no gold demos). Every run's figures
go to ``<out>/bench_local_learning.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aclarena_slime.local.session import open_session
from aclarena_slime.local.stage import run_stage
from aclarena_slime.recipes.compose import load_recipe
from aclarena_slime.worker_pool import worker_pool

REPO = Path(__file__).resolve().parents[1]
RECIPES = {"math": "stage1_math", "search": "stage2_search", "ifeval": "stage4_if", "retail": "stage3_retail"}


def cpu_seconds() -> float:
    """User + system seconds of this process and its finished children (the math verifier's workers)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def run_one(env: str, seed: int, out: Path, overrides: list[str]) -> dict[str, Any]:
    """One local stage of ``env`` at ``seed``: its rewards, GRPO's training figures, CPU and wall seconds."""
    recipe = load_recipe(
        REPO / "recipes" / f"{RECIPES[env]}.yaml",
        # The validation prompts are evaluated here (the main command skips them): the settings are chosen on them.
        ["cluster=local", f"paths.root={out / f'seed{seed}'}", f"+cluster.local.seed={seed}",
         "cluster.local.validation_eval=true", *overrides],  # fmt: skip
    )
    wall, cpu = time.perf_counter(), cpu_seconds()
    metrics = run_stage(open_session(recipe))
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    rewards = [step["reward_mean"] for step in metrics["steps"]]
    greedy = metrics.get("eval_greedy") or {}
    return {
        "env": env,
        "seed": seed,
        "base": metrics["eval_before"]["mean_reward"],
        "warm_start": (metrics.get("eval_warm_start") or metrics["eval_before"])["mean_reward"],
        "trained": metrics["eval_after"]["mean_reward"],
        # With a sampled evaluation (the profile's), the greedy reward of the same prompts beside it.
        "greedy_before": (greedy.get("before") or {}).get("mean_reward"),
        "greedy_after": (greedy.get("after") or {}).get("mean_reward"),
        "held_out_n": metrics["eval_after"].get("prompts", metrics["eval_after"]["n"]),
        "eval_samples": metrics["eval_after"].get("samples_per_prompt", 1),
        # The reward on the validation prompts (cluster.local.validation_size), evaluated as the held-out ones,
        # after each evaluated step: what the profile's settings were chosen on.
        "validation": [[v["step"], v["mean_reward"]] for v in metrics.get("eval_validation") or []],
        "rollout_reward_first": statistics.fmean(rewards[:2]) if rewards else None,
        "rollout_reward_last": statistics.fmean(rewards[-2:]) if rewards else None,
        "steps": len(rewards),
        "warm_start_cached": bool((metrics.get("warm_start") or {}).get("cached")),  # its CPU s are not in cpu_s
        "cpu_s": round(cpu, 1),
        "wall_s": round(wall, 1),
    }


def spread(values: list[float]) -> str:
    """Mean ± half the range, or '-' when there is nothing to summarise."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.fmean(values):.3f} ± {(max(values) - min(values)) / 2:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["math", "search", "ifeval"], choices=list(RECIPES))
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0 .. N-1 per env")
    parser.add_argument("--retail-data", help="the τ³-Retail data folder: adds the retail stage")
    parser.add_argument("--out", default="runs/bench_local_learning", help="folder for the stages' outputs")
    parser.add_argument("--jobs", type=int, default=1, help="stages run at once, each in its own process")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. rollout.num_rollout=4")
    args = parser.parse_args()
    if args.seeds < 1 or args.jobs < 1:
        parser.error(f"--seeds and --jobs must be at least 1, got {args.seeds} and {args.jobs}")
    envs = [e for e in args.envs if e != "retail"]
    if args.retail_data:
        envs.append("retail")
    elif "retail" in args.envs:
        parser.error("the retail stage needs --retail-data DIR (the τ³-Retail data folder)")
    out = Path(args.out).resolve()
    todo = [
        (
            env,
            seed,
            out / env,
            [*([f"env_config.retail.data_dir={args.retail_data}"] if env == "retail" else []), *args.overrides],
        )
        for env in envs
        for seed in range(args.seeds)
    ]
    if args.jobs == 1:
        runs = [run_one(*job) for job in todo]
    else:  # each stage in a fresh process: one torch thread each, its CPU seconds its own
        with worker_pool(args.jobs, max_tasks_per_child=1) as pool:
            runs = list(pool.map(run_one, *zip(*todo, strict=True)))
    table = Table(title=f"local profile: held-out mean reward, {args.seeds} seed(s), mean ± half range")
    columns = ("env", "prompts x samples", "base", "warm start", "trained", "GRPO gain", "greedy gain",
               "validation gain", "rollout reward", "CPU s", "wall s")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for env in envs:
        mine = [r for r in runs if r["env"] == env]
        gains = [r["trained"] - r["warm_start"] for r in mine if r["trained"] is not None]
        table.add_row(
            env,
            f"{mine[0]['held_out_n']} x {mine[0]['eval_samples']}",
            *(spread([r[key] for r in mine]) for key in ("base", "warm_start", "trained")),
            spread(gains),
            spread([r["greedy_after"] - r["greedy_before"] for r in mine if r["greedy_after"] is not None]),
            spread([r["validation"][-1][1] - r["validation"][0][1] for r in mine if r["validation"]]),
            f"{spread([r['rollout_reward_first'] for r in mine])} -> {spread([r['rollout_reward_last'] for r in mine])}",
            f"{statistics.fmean(r['cpu_s'] for r in mine):.0f}",
            f"{statistics.fmean(r['wall_s'] for r in mine):.0f}",
        )
    Console(width=180).print(table)
    load = os.getloadavg()
    report = {"seeds": args.seeds, "overrides": args.overrides, "load_after": load, "runs": runs}
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_local_learning.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"load average {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}; figures in {out / 'bench_local_learning.json'}")


if __name__ == "__main__":
    main()
