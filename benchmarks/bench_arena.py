"""The arena over seeds: every method's forgetting matrix and the comparison table, mean ± spread.

    .venv/bin/python benchmarks/bench_arena.py [--seeds 3] [--first-seed 0] [--jobs 3] [--out DIR]
        [--set data.retail=PATH/tau3-retail] [--methods sequential mle oracles]
        [--chain recipes/curriculum/arena_local.yaml | recipes/curriculum/arena_reasoning_gym.yaml]

Runs the arena file (docs/arena.md) once per seed (--first-seed onwards, 0..N-1 by default; a seed the
comparison never uses, e.g. 100, gives validation prompts to choose on; a seed already run in --out is resumed, not
redone; ``--jobs`` seeds at once, each in its own process), compares the methods of each seed (``aclarena eval matrix --run ...``: tables, heatmaps, curves per
seed), then prints the table over seeds (mean ± sample standard deviation), the final accuracy per domain
(with the shared base's, and each oracle's gain over it: the reasoning-gym chain's selection rule),
the issue's two checks (sequential forgets: BWT <= -5 points or a maximum forgetting >= 10 points; MLE
within 3 points of its oracle on every domain), where each method's time went (the stages' own timings: warm
start, GRPO steps, the rest of the stage, the evaluation after it), the wall and CPU time with the machine's load, and writes
``bench_arena.json`` and ``arena_heatmap.png`` (the mean matrices of sequential, replay and MLE side by side: the README's
figure) into --out.
Accuracies are percent (points), as the matrix holds them. The tiny model's figures show the study's shape,
not the paper's numbers. It replaces bench_comparison.py; that one's monitor-overhead table is not kept
(the arena runs without the monitor, whose cost its own tests and docs/evaluation.md describe).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aclarena_slime.analysis import plots
from aclarena_slime.analysis.comparison import COLUMNS, load_run
from aclarena_slime.analysis.forgetting import ForgettingMatrix
from aclarena_slime.analysis.sources import load_summary
from aclarena_slime.arena.runner import run_arena
from aclarena_slime.cli import main as cli
from aclarena_slime.worker_pool import worker_pool

ROOT = Path(__file__).resolve().parents[1]
FORGETS_BWT, FORGETS_MAX, MLE_GAP = -5.0, 10.0, 3.0  # the targets (0.05, 0.10, 0.03) in points


def short_names(domains: list[str]) -> dict[str, str]:
    """Display names: the variant part of tags that are all one plugin's variants (``reasoning_gym-spell_backward``
    -> ``spell_backward``), else the tags."""
    plugins = {d.split("-", 1)[0] for d in domains}
    if len(plugins) == 1 and all("-" in d for d in domains):
        return {d: d.split("-", 1)[1] for d in domains}
    return {d: d for d in domains}


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def spread(values: list[float | None]) -> tuple[float | None, float | None]:
    known = [v for v in values if v is not None]
    if not known:
        return None, None
    return statistics.fmean(known), statistics.stdev(known) if len(known) > 1 else 0.0


def cell(values: list[float | None], integer: bool = False) -> str:
    mean, sd = spread(values)
    if mean is None:
        return "–"
    return f"{mean:,.0f}" if integer else f"{mean:.1f} ± {sd:.1f}"


def peak_rss_gb() -> float:
    """The largest resident memory of this process and the children it waited for (Linux: ru_maxrss in KiB)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return max(own.ru_maxrss, children.ru_maxrss) / 2**20


def run_seed(
    arena: Path, overrides: list[str], methods: list[str] | None
) -> tuple[dict[str, Any], float, float, float]:
    """One seed's arena (in a worker process): its index, wall and CPU seconds, and the worker's peak memory (GB;
    a worker that ran an earlier seed counts that one's too)."""
    t0, c0 = time.perf_counter(), cpu_seconds()
    index = run_arena(arena, overrides, methods)
    return index, time.perf_counter() - t0, cpu_seconds() - c0, peak_rss_gb()


def seed_rows(index: dict[str, Any], out: Path) -> dict[str, Any]:
    """One seed's comparison (files under ``out``) and its rows, by method."""
    runs = [f"--run={name}={entry['manifest']}" for name, entry in index["methods"].items()]
    with contextlib.redirect_stdout(io.StringIO()):  # the per-seed tables are in the files; ours follows
        status = cli(["eval", "matrix", *runs, "--base", index["base_eval"], "--out", str(out), "--json"])
    if status != 0:
        raise SystemExit(f"the comparison of seed {index['seed']} failed")
    return {name: load_run(name, entry["manifest"], index["base_eval"]) for name, entry in index["methods"].items()}


def mean_matrix(out: Path, seeds: list[int], method: str) -> ForgettingMatrix | None:
    """The method's forgetting matrix averaged over seeds (cells of every seed that has them)."""
    found = [json.loads(p.read_text()) for s in seeds if (p := out / f"seed_{s}" / "comparison" / method /
                                                           "matrix.json").is_file()]  # fmt: skip
    if not found:
        return None
    first = found[0]
    cells = [[spread([m["values"][i][j] for m in found])[0] for j in range(len(first["domains"]))]
             for i in range(len(first["stages"]))]  # fmt: skip
    rows = [(stage, trained, dict(zip(first["domains"], row, strict=True)))
            for stage, trained, row in zip(first["stages"], first["trained"], cells, strict=True)]  # fmt: skip
    return ForgettingMatrix.from_rows(rows, domains=first["domains"])


PHASES = ("warm start SFT", "GRPO steps", "rest of the stage", "evaluation after it")


def stage_times(manifest: Path) -> list[tuple[str, dict[str, float]]]:
    """Each stage the method ran itself (not reused): seconds per phase of :data:`PHASES`, from its local stage's
    ``metrics.json`` (the warm start's SFT, the GRPO steps, the stage's total) and its manifest (finished, then
    evaluated: the summary's time)."""
    out = []
    for entry in json.loads(manifest.read_text())["stages"]:
        if entry.get("reused_from") or entry.get("status") != "done":
            continue
        output = entry.get("checkpoint") or entry.get("adapter")  # the local stage's folder holds metrics.json
        metrics_file = Path(output).parent / "metrics.json" if output else None
        metrics = json.loads(metrics_file.read_text()) if metrics_file and metrics_file.is_file() else {}
        sft = float(((metrics.get("warm_start") or {}).get("sft") or {}).get("seconds") or 0.0)
        grpo = sum(float(step.get("seconds") or 0.0) for step in metrics.get("steps") or [])
        summary = (entry.get("eval") or {}).get("summary")
        path = Path(summary) if summary and Path(summary).is_absolute() else manifest.parent / str(summary)
        evaluation = path.stat().st_mtime - float(entry["finished_at"]) if summary and path.is_file() else 0.0
        total = float(metrics.get("seconds") or 0.0)
        out.append((entry["name"], dict(zip(PHASES, (sft, grpo, total - sft - grpo, evaluation), strict=True))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_arena")
    parser.add_argument("--chain", "--arena", dest="arena", type=Path,
                        default=ROOT / "recipes" / "curriculum" / "arena_local.yaml", help="the arena file")
    parser.add_argument("--first-seed", type=int, default=0, help="the seeds run are FIRST..FIRST+SEEDS-1")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override of the arena file")
    parser.add_argument("--methods", nargs="+", help="only these methods (default: the arena file's)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="seeds run at once, each in its own process on torch_threads (1): --jobs = --seeds "
                             "keeps every core busy to the end")  # fmt: skip
    args = parser.parse_args()
    out = args.out.resolve()
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    started_wall, started_cpu, load_before = time.perf_counter(), cpu_seconds(), os.getloadavg()
    per_seed: dict[int, dict[str, Any]] = {}
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be positive, got {args.jobs}")
    with worker_pool(min(args.jobs, len(seeds))) as pool:  # fresh interpreters, gone when this process is
        futures = {seed: pool.submit(run_seed, args.arena, [f"output_dir={out}", f"seed={seed}", *args.set],
                                     args.methods) for seed in seeds}  # fmt: skip
        for seed, future in futures.items():
            index, seed_wall, seed_cpu, seed_rss = future.result()
            rows = seed_rows(index, out / f"seed_{seed}" / "comparison")
            per_seed[seed] = {"rows": rows, "wall_s": seed_wall, "cpu_s": seed_cpu, "peak_rss_gb": seed_rss,
                              "index": index}  # fmt: skip
            print(f"[bench] seed {seed}: {seed_wall:.0f} s wall, {seed_cpu:.0f} s CPU, peak {seed_rss:.1f} GB, "
                  f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)  # fmt: skip
    wall, cpu, load_after = time.perf_counter() - started_wall, cpu_seconds() - started_cpu, os.getloadavg()
    methods = list(per_seed[seeds[0]]["rows"])
    domains = sorted({d for s in seeds for r in per_seed[s]["rows"].values() for d in r.domains})

    def values(method: str, key: str) -> list[float | None]:
        return [per_seed[s]["rows"][method].values.get(key) for s in seeds]

    def finals(method: str, domain: str) -> list[float | None]:
        return [per_seed[s]["rows"][method].domains.get(domain) for s in seeds]

    def base(domain: str) -> list[float | None]:
        return [load_summary(per_seed[s]["index"]["base_eval"]).domains.get(domain) for s in seeds]

    console = Console(width=160)
    table = Table(title=f"arena over {len(seeds)} seed(s): mean ± sd (accuracy in points)")
    for column in ("method", *(title for _, title in COLUMNS)):
        table.add_column(column, justify="left" if column == "method" else "right")
    for method in methods:
        table.add_row(method, *(cell(values(method, k), k in ("rollout_tokens", "trainer_steps")) for k, _ in COLUMNS))
    console.print(table)
    names = short_names(domains)
    per_domain = Table(title="final accuracy per domain (oracles: each domain trained alone)")
    for column in ("method", *(names[d] for d in domains)):
        per_domain.add_column(column, justify="left" if column == "method" else "right")
    per_domain.add_row("base", *(cell(base(d)) for d in domains))
    for method in methods:
        per_domain.add_row(method, *(cell(finals(method, d)) for d in domains))
    gains = {}
    if "oracles" in methods:  # each oracle's gain over the base, seed by seed
        pairs = {d: zip(finals("oracles", d), base(d), strict=True) for d in domains}
        gains = {d: [None if o is None or b is None else o - b for o, b in pairs[d]] for d in domains}
        per_domain.add_row("oracle - base", *(cell(gains[d]) for d in domains))
    console.print(per_domain)
    checks: dict[str, Any] = {}
    if "sequential" in methods:
        bwt = spread(values("sequential", "bwt"))[0]
        drop = spread(values("sequential", "max_forgetting"))[0]
        checks["sequential_forgets"] = bool((bwt is not None and bwt <= FORGETS_BWT) or
                                            (drop is not None and drop >= FORGETS_MAX))  # fmt: skip
        console.print(f"sequential forgets (BWT <= {FORGETS_BWT} or max forgetting >= {FORGETS_MAX}): "
                      f"BWT {bwt}, max forgetting {drop} -> {checks['sequential_forgets']}")  # fmt: skip
    if "mle" in methods and "oracles" in methods:
        gaps = {d: (spread(finals("mle", d))[0] or 0.0) - (spread(finals("oracles", d))[0] or 0.0) for d in domains}
        checks["mle_gap_to_oracles"] = gaps
        checks["mle_within_oracles"] = all(abs(g) <= MLE_GAP for g in gaps.values())
        console.print(f"MLE - oracle per domain (points): { {d: round(g, 1) for d, g in gaps.items()} } "
                      f"-> within {MLE_GAP}: {checks['mle_within_oracles']}")  # fmt: skip
    profile = Table(title="where the time went: seconds per seed (mean over seeds), stages run (not reused)")
    for column in ("method", "stages", *PHASES, "most expensive stage"):
        profile.add_column(column, justify="left" if column in ("method", "most expensive stage") else "right")
    times: dict[str, dict[str, float]] = {}
    for method in methods:
        stages = [t for s in seeds for t in stage_times(Path(per_seed[s]["index"]["methods"][method]["manifest"]))]
        times[method] = {phase: sum(t[phase] for _, t in stages) / len(seeds) for phase in PHASES}
        worst = max(stages, key=lambda st: sum(st[1].values()), default=None)
        profile.add_row(method, f"{len(stages) / len(seeds):.0f}", *(f"{times[method][p]:.0f}" for p in PHASES),
                        f"{worst[0]} ({sum(worst[1].values()):.0f} s)" if worst else "–")  # fmt: skip
    console.print(profile)
    peak = max(v["peak_rss_gb"] for v in per_seed.values())
    console.print(f"{len(seeds)} seed(s): {wall / 60:.1f} min wall, {cpu / 60:.1f} min CPU, peak memory of a seed "
                  f"{peak:.1f} GB; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
                  f"({os.cpu_count()} cores)")  # fmt: skip
    panels = [(f"{m} (mean of {len(seeds)} seeds)", matrix) for m in ("sequential", "replay", "mle")
              if m in methods and (matrix := mean_matrix(out, seeds, m)) is not None]  # fmt: skip
    if panels:
        plots.heatmaps(panels, out / "arena_heatmap.png", titles=names)
    report = {
        "seeds": seeds,
        "arena": str(args.arena),
        "set": args.set,
        "wall_s": wall,
        "cpu_s": cpu,
        "load_before": load_before,
        "load_after": load_after,
        "checks": checks,
        "base": {d: base(d) for d in domains},
        "oracle_gain": gains,
        "seconds_per_seed": times,
        "per_seed": {
            s: {
                "wall_s": v["wall_s"],
                "cpu_s": v["cpu_s"],
                "peak_rss_gb": v["peak_rss_gb"],
                "methods": {m: {**r.values, "domains": r.domains} for m, r in v["rows"].items()},
            }
            for s, v in per_seed.items()
        },  # fmt: skip
    }
    (out / "bench_arena.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"files: {out}/bench_arena.json, {out}/arena_heatmap.png, {out}/seed_*/comparison/")


if __name__ == "__main__":
    main()
