"""Math verification throughput, single process vs the worker pool, and the event loop's worst stall.

    .venv/bin/python benchmarks/bench_math_verify.py [--n 200] [--workers 2]

Prints a table. "single process" calls math-verify inline (what a naive reward function does: it
blocks the event loop for the whole check); "pool" runs the same checks concurrently through
``VerifierPool`` while a heartbeat task measures how late the loop wakes up.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

from rich.console import Console
from rich.table import Table

from aclarena_envs.math.verifier import VerifierPool, verify_answer


def workload(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Mixed answers like a math rollout produces: integers, fractions, radicals, expressions."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        kind = rng.choice(["int", "frac", "sqrt", "poly"])
        if kind == "int":
            pairs.append((str(a * b), f"{a * b:03d}"))
        elif kind == "frac":
            pairs.append(
                (f"\\frac{{{a}}}{{{b}}}", f"{a / b:.6f}" if rng.random() < 0.5 else f"\\frac{{{2 * a}}}{{{2 * b}}}")
            )
        elif kind == "sqrt":
            pairs.append((f"{a}\\sqrt{{2}}", f"\\sqrt{{{2 * a * a}}}"))
        else:
            pairs.append((f"(x+{a})^2", f"x^2+{2 * a}x+{a * a}"))
    return pairs


def run_inline(pairs: list[tuple[str, str]]) -> float:
    from math_verify import parse, verify

    start = time.perf_counter()
    for gold, pred in pairs:
        verify(parse(f"${gold}$"), parse(f"\\boxed{{{pred}}}"))
    return time.perf_counter() - start


async def run_pool(pairs: list[tuple[str, str]], pool: VerifierPool) -> tuple[float, float]:
    stall = 0.0
    stop = False

    async def heartbeat() -> None:
        nonlocal stall
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            stall = max(stall, time.perf_counter() - t - 0.01)

    beat = asyncio.create_task(heartbeat())
    start = time.perf_counter()
    await asyncio.gather(*(verify_answer(g, p, pool) for g, p in pairs))
    elapsed = time.perf_counter() - start
    stop = True
    await beat
    return elapsed, stall


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    pairs = workload(args.n)
    non_int = [p for p in pairs if not p[0].isdigit()]

    inline_s = run_inline(pairs)
    pool = VerifierPool(workers=args.workers, timeout_s=5.0)
    await asyncio.gather(*(pool.check("1", "1") for _ in range(args.workers)))  # start-up is not throughput
    pool_s, stall_s = await run_pool(pairs, pool)
    patho_start = time.perf_counter()
    patho = await verify_answer("1", "9^{9^{9^{9}}}", pool)
    patho_s = time.perf_counter() - patho_start
    pool.close()

    table = Table(title=f"math verification, {len(pairs)} answers ({len(non_int)} need math-verify)")
    for col in ("mode", "checks/s", "wall s", "worst loop stall ms"):
        table.add_column(col, justify="right")
    table.add_row(
        "single process (inline)", f"{len(pairs) / inline_s:.0f}", f"{inline_s:.2f}", f"{inline_s * 1000:.0f} (blocks)"
    )
    table.add_row(
        f"pool ({args.workers} workers)", f"{len(pairs) / pool_s:.0f}", f"{pool_s:.2f}", f"{stall_s * 1000:.1f}"
    )
    table.add_row("pathological 9^{9^{9^{9}}}", "-", f"{patho_s:.2f}", f"verdict: {patho.method}")
    Console().print(table)


if __name__ == "__main__":
    asyncio.run(main())
