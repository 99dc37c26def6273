"""Evaluation overhead: the runner's samples per second against an instant engine, and entropy analysis speed.

    .venv/bin/python benchmarks/bench_eval.py [--samples 400] [--concurrency 32]

Prints a table. The engine is the fake SGLang (scripted replies, no model), so the figure is what the
runner itself costs per sample (prompt rendering, the agent loop, the env, one JSON line); a real
engine's generation time adds to it. The entropy row scores saved top-20 log-probs of 100k positions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aclarena_slime.analysis.entropy import compare, stats_from_top_logprobs
from aclarena_slime.evaluation import RunSettings, parse_suite, run_suite
from aclarena_slime.experts import ExpertTable
from aclarena_slime.local.tiny_model import build_tiny_tokenizer
from aclarena_slime.sglang_client import SGLangClient, new_session
from aclarena_slime.testing.fake_sglang import FakeSGLang


async def runner_rate(n: int, concurrency: int) -> float:
    tokenizer = build_tiny_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "mock.jsonl").write_text("".join(json.dumps({"prompt": "", "label": "pear"}) + "\n" for _ in range(n)))
        suite = parse_suite({"datasets": {"guess": {"env": "mock", "path": "mock.jsonl", "max_response_len": 128}}})
        experts = ExpertTable.from_mapping({"mock": "mock-expert"})
        async with FakeSGLang(tokenizer, ["<guess>apple</guess>", "<guess>pear</guess>"]) as engine:
            start = time.perf_counter()
            settings = RunSettings(root / "out", root, concurrency=concurrency)
            async with new_session() as session:
                await run_suite(suite, SGLangClient(engine.url, session=session), tokenizer, settings, experts)
            elapsed = time.perf_counter() - start
    return n / elapsed


def entropy_rate(positions: int, k: int = 20) -> float:
    rng = random.Random(0)

    def fake() -> list[list[list[float]]]:
        out = []
        for _ in range(positions):
            weights = sorted((rng.random() ** 4 for _ in range(k)), reverse=True)
            total = sum(weights) * 1.05
            out.append([[math.log(w / total), rng.randrange(50_000), None] for w in weights])
        return out

    a, b = fake(), fake()
    start = time.perf_counter()
    compare(stats_from_top_logprobs(a), stats_from_top_logprobs(b))
    return positions / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--positions", type=int, default=100_000)
    args = parser.parse_args()
    table = Table(title="evaluation overhead")
    table.add_column("what")
    table.add_column("rate", justify="right")
    rate = asyncio.run(runner_rate(args.samples, args.concurrency))
    table.add_row(f"eval runner, mock env, 2 turns, {args.samples} samples", f"{rate:,.0f} samples/s")
    table.add_row(
        f"entropy stability from top-20, {args.positions:,} positions",
        f"{entropy_rate(args.positions):,.0f} positions/s",
    )
    Console().print(table)


if __name__ == "__main__":
    main()
