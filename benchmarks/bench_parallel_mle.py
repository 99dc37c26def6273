"""Parallel MLE vs the experts one after another: time and backbone memory, locally and (estimated) on paper.

    python benchmarks/bench_parallel_mle.py [--envs math search ifeval] [--retail-data PATH/tau3-retail]
                                            [--out runs/bench_parallel_mle] [OVERRIDE ...]  e.g. rollout.num_rollout=4

Local (measured): ``recipes/mle_parallel.yaml`` on the local backend (``cluster=local``, the tiny model), its
experts (one per env) trained one after another, each as its own stage (``run_stage``: its own backbone,
trainer and engine) — the anchor a user picks today (``recipes/curriculum/mle.yaml``) — and side by side in
one job (``run_parallel_mle``: one backbone, one engine, one trainer with N adapters); same seeds, same
steps (a line per expert says whether its step rewards came out equal). An untimed warm-up run pays the
imports first. Columns: wall and CPU seconds (this process's user + system; on a shared machine wall is inflated,
CPU is not), the backbone copies each holds (the trainer's and the engine's) and their bytes: at peak, and
summed over the jobs (what was loaded, once per job).

On paper (estimated, not measured; no GPU run here): the paper's four MLE stages (``recipes/mle_*.yaml``) on
2 x 8 H200, one job per stage vs one job for all four. From the recipes: GPUs per job, and each stage's
rollout token budget (num_rollout x rollout_batch_size x n_samples_per_prompt x response budget x turns).
Assumptions, printed with the table and settable: the tokens a GPU processes per second (rollout and
training together), the fraction of the budget responses really use, and a job's start-up (Ray, model load,
SGLang with CUDA graphs, the first sync). Side by side the experts take the same samples as their stages,
so the estimate saves only the start-ups of three jobs and three backbone loads; the idle rollout time a
mixed pool fills (one domain's long episodes while another's are done) is not modelled.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aclarena_slime.local.parallel_mle import open_experts, run_parallel_mle
from aclarena_slime.local.run import expert_sessions
from aclarena_slime.local.session import LocalSession, open_session
from aclarena_slime.local.stage import run_stage
from aclarena_slime.recipes.compose import load_recipe

REPO = Path(__file__).resolve().parents[1]
PAPER_STAGES = {"math": "mle_math", "search": "mle_search", "retail": "mle_retail", "ifeval": "mle_if"}
# Model turns per episode at most, for the per-turn budgets (the env settings' own limits; math and IF: 1).
TURNS = {"math": 1, "search": 5, "retail": 10, "ifeval": 1}


def cpu_seconds() -> float:
    """User + system seconds of this process and its finished children."""
    return sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def backbone_bytes(model_dir: Path) -> int:
    """Bytes of one copy of the backbone's weights (float32 on the local backend)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def local_rows(args: argparse.Namespace) -> list[tuple[str, ...]]:
    overrides = ["cluster=local", f"paths.root={Path(args.out).resolve()}", f"lora.experts=[{','.join(args.envs)}]",
                 "++cluster.local.progress=false"]  # fmt: skip
    if args.retail_data:
        overrides.append(f"env_config.retail.data_dir={args.retail_data}")

    def experts(*more: str) -> list[LocalSession]:
        """Each expert's session, to train it alone as a stage (run_stage) and side by side."""
        recipe = load_recipe(REPO / "recipes" / "mle_parallel.yaml", [*overrides, *args.overrides, *more])
        return expert_sessions(open_session(recipe), recipe.env_config)

    sessions = experts()
    out = Path(args.out)
    shutil.rmtree(out / "sequential", ignore_errors=True)
    alone: dict[str, dict] = {}
    rows = []
    # Warm-up, untimed: the first run in a process pays the imports (transformers, PEFT, the envs' scorers).
    run_parallel_mle(open_experts(experts("rollout.num_rollout=1")), out / "warm_up")
    wall, cpu = time.monotonic(), cpu_seconds()
    for s in sessions:
        alone[s.env] = run_stage(dataclasses.replace(s, paths=dataclasses.replace(s.paths,
                                                                                  output_dir=out / "sequential" / s.env)))
    seq = (time.monotonic() - wall, cpu_seconds() - cpu)
    wall, cpu = time.monotonic(), cpu_seconds()
    metrics = run_parallel_mle(open_experts(sessions), out / "parallel")
    par = (time.monotonic() - wall, cpu_seconds() - cpu)
    size = backbone_bytes(Path(metrics["model_dir"]))
    n = len(sessions)
    # Each job holds two copies: the trainer's model and the engine's (as slime's actor and SGLang do).
    rows.append(("one after another", str(n), f"{seq[0]:.1f}", f"{seq[1]:.1f}", f"2 x {size:,}", f"{2 * n * size:,}"))
    rows.append(("side by side", "1", f"{par[0]:.1f}", f"{par[1]:.1f}", f"2 x {size:,}", f"{2 * size:,}"))
    for s in sessions:  # the same training both ways: each expert's step rewards and held-out reward
        mine, theirs = metrics["experts"][s.env], alone[s.env]
        same = [s["reward_mean"] for s in mine["steps"]] == [s["reward_mean"] for s in theirs["steps"]]
        print(f"{s.env}: step rewards equal both ways: {same}; held-out after: "
              f"{theirs['eval_after']['mean_reward']} alone, {mine['eval_after']['mean_reward']} side by side")  # fmt: skip
    return rows


def paper_rows(args: argparse.Namespace) -> tuple[list[tuple[str, ...]], float, float]:
    jobs = []
    for env, name in PAPER_STAGES.items():
        recipe = load_recipe(REPO / "recipes" / f"{name}.yaml", ["paths.root=/x"])
        r, c = recipe.rollout, recipe.cluster
        gpus = c.actor_num_nodes * c.actor_num_gpus_per_node
        tokens = r.num_rollout * r.rollout_batch_size * r.n_samples_per_prompt * r.rollout_max_response_len * TURNS[env]
        jobs.append((env, gpus, tokens))
    rate = args.tokens_per_gpu_second
    rows = []
    total_seq = 0.0
    for env, gpus, tokens in jobs:
        hours = tokens * args.budget_used / (rate * gpus) / 3600 + args.startup_minutes / 60
        total_seq += hours * gpus
        rows.append((f"mle_{env}", str(gpus), f"{tokens:.3g}", f"{hours:.1f}", f"{hours * gpus:,.0f}"))
    gpus = max(g for _, g, _ in jobs)
    tokens = sum(t for *_, t in jobs)
    hours = tokens * args.budget_used / (rate * gpus) / 3600 + args.startup_minutes / 60
    rows.append(("four stages, one after another", "", "", "", f"{total_seq:,.0f}"))
    rows.append(("mle_parallel (same samples)", str(gpus), f"{tokens:.3g}", f"{hours:.1f}", f"{hours * gpus:,.0f}"))
    return rows, total_seq, hours * gpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["math", "search", "ifeval"])
    parser.add_argument("--retail-data", default=None, help="the tau3-retail data folder: adds the retail expert")
    parser.add_argument("--out", default="runs/bench_parallel_mle")
    parser.add_argument("--tokens-per-gpu-second", type=float, default=1000.0, help="assumed (paper estimate)")
    parser.add_argument("--budget-used", type=float, default=0.3, help="assumed share of the token budget used")
    parser.add_argument("--startup-minutes", type=float, default=20.0, help="assumed start-up of one slime job")
    parser.add_argument("--skip-local", action="store_true", help="print the paper estimate only")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. rollout.num_rollout=4")
    args = parser.parse_args()
    if args.retail_data and "retail" not in args.envs:
        args.envs.append("retail")
    console = Console()
    if not args.skip_local:
        local = Table(title=f"local backend, tiny model: experts {', '.join(args.envs)} (measured)")
        for column in ("how", "jobs", "wall s", "CPU s", "backbone bytes at peak", "backbone bytes loaded"):
            local.add_column(column, justify="right")
        for row in local_rows(args):
            local.add_row(*row)
        console.print(local)
    rows, seq, par = paper_rows(args)
    paper = Table(title="paper: four MLE stages on 2 x 8 H200 (ESTIMATE from the recipes' sizes, not measured)")
    for column in ("run", "GPUs", "token budget", "hours", "GPU-hours"):
        paper.add_column(column, justify="right")
    for row in rows:
        paper.add_row(*row)
    console.print(paper)
    console.print(
        f"assumed: {args.tokens_per_gpu_second:g} tokens/s per GPU, {args.budget_used:g} of the budget used, "
        f"{args.startup_minutes:g} min start-up per job; saving {seq - par:,.0f} GPU-hours ({(seq - par) / seq:.1%}); "
        "backbone held by one job instead of four in turn (Qwen3-8B bf16: 16.4 GB per copy)"
    )


if __name__ == "__main__":
    main()
