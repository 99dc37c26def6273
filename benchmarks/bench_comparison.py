"""The comparison table end to end on the local backend, and what the forgetting monitor costs.

    .venv/bin/python benchmarks/bench_comparison.py [--out DIR] [--interval 1]

Runs three two-stage curricula (math -> IFEval, tiny model, CPU): sequential, replay and KL anchor,
each with the forgetting monitor on; evaluates every stage's policy on both domains (the smoke suite)
and the base model once; then prints the comparison table (``aclarena eval matrix --run ...``) and, per
watched stage, the share of the stage's time the monitor spent evaluating. The tiny model's numbers
say nothing about the methods; they show that the whole path runs and what the monitor adds. The KL
anchor has no KL term on the local backend, so it matches the sequential run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aclarena_slime.analysis.comparison import load_run, to_markdown, write_comparison
from aclarena_slime.cli import main as cli
from aclarena_slime.curriculum.runner import run_curriculum

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
SUITE = RECIPES / "eval" / "smoke.yaml"
METHODS = {
    "sequential": "",
    "replay": "replay: {enabled: true, share: 0.5}\n",
    "KL anchor": "kl_anchor: {enabled: true, coef: 0.1}\n",
}


def policy_evaluator(out: Path):
    """Every domain through the stage's own adapter (the policy the chain has reached), on the local engine."""

    def evaluate(stage: str, entry: dict[str, Any], results: Path) -> Path | None:
        adapter = Path(entry["adapter"]).resolve()
        experts = out / f"policy_{stage}.json"
        path = str(adapter.relative_to(out.resolve()))
        table = {tag: {"adapter": "policy", "path": path} for tag in ("math", "ifeval")}
        experts.write_text(json.dumps({"version": 1, "experts": table}))
        model = entry["metrics"]["model_dir"]
        argv = ["eval", "run", str(SUITE), "--local-model", model, "--experts", str(experts), "--load-experts",
                "--stage", stage, "--out", str(results)]  # fmt: skip
        if cli(argv) != 0:
            raise RuntimeError(f"evaluation of {stage} failed")
        return results / "summary.json"

    return evaluate


def run_method(name: str, extra: str, root: Path, interval: int) -> Path:
    out = root / name.replace(" ", "_")
    path = root / f"{out.name}.yaml"
    path.write_text(
        f"name: {out.name}\noutput_dir: {out}\noverrides: [cluster=local, paths.root={root}]\n"
        f"stages:\n  - {{name: {out.name}_math, recipe: {RECIPES}/stage1_math.yaml}}\n"
        f"  - {{name: {out.name}_if, recipe: {RECIPES}/stage4_if.yaml}}\n"
        f"monitor: {{enabled: true, interval: {interval}, demo_size: 6, max_response_len: 32}}\n" + extra
    )
    started = time.perf_counter()
    run_curriculum(path, evaluator=policy_evaluator(out))
    print(f"[bench] {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return out / "manifest.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--interval", type=int, default=1, help="monitor check every N rollouts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = (args.out or Path(tmp)).resolve()
        root.mkdir(parents=True, exist_ok=True)
        manifests = {name: run_method(name, extra, root, args.interval) for name, extra in METHODS.items()}
        first = json.loads(manifests["sequential"].read_text())["stages"][0]
        base = root / "base_eval"
        cli(["eval", "run", str(SUITE), "--local-model", first["metrics"]["model_dir"], "--stage", "base",
             "--out", str(base)])  # fmt: skip
        rows = [load_run(name, path, base / "summary.json") for name, path in manifests.items()]
        write_comparison(rows, root / "comparison")
        console = Console()
        console.print(to_markdown(rows))
        overhead = Table(title="forgetting monitor: share of stage time spent evaluating earlier domains")
        for column in ("method", "stage", "checks", "monitor s", "stage s", "share"):
            overhead.add_column(column, justify="left" if column in ("method", "stage") else "right")
        for name, path in manifests.items():
            for stage in json.loads(path.read_text())["stages"]:
                report, seconds = stage.get("monitor"), (stage.get("metrics") or {}).get("seconds")
                if not report or not seconds:
                    continue
                checks = len(next(iter(report["curves"].values())))
                share = f"{100 * report['seconds'] / seconds:.0f} %"
                overhead.add_row(name, stage["name"], str(checks), f"{report['seconds']:.1f}", f"{seconds:.1f}", share)
        console.print(overhead)
        console.print(f"files: {root / 'comparison'}" if args.out else "(temporary folder; --out DIR keeps it)")


if __name__ == "__main__":
    main()
