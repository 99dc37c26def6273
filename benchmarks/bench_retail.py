"""τ³-Retail env costs: tool calls per second, episode reset, database hash, scoring.

    .venv/bin/python benchmarks/bench_retail.py --data ../shared/data/tau3-retail [--calls 20000]

Prints a table. Measured on the user's data directory (τ³'s retail data: 500 users, 1,000 orders,
50 products). "reset" is what starting an episode costs the env (a private copy of the database),
"hash" one canonical hash of the whole state, "score" a finished episode's reward with writes (its
hash; the gold hash is cached per task), "gold replay" one task's gold actions from a fresh copy.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from aclarena_envs.retail.data import RetailData
from aclarena_envs.retail.db import canonical_hash
from aclarena_envs.retail.reward import replay_gold
from aclarena_envs.retail.tool_calls import ToolCallParser
from aclarena_envs.retail.tools import RetailTools


def per_second(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="τ³-Retail data directory")
    parser.add_argument("--calls", type=int, default=20000, help="tool calls to time")
    args = parser.parse_args()

    start = time.perf_counter()
    data = RetailData.load(args.data)
    load_s = time.perf_counter() - start
    rng = random.Random(0)
    db = data.db.fresh()
    orders, users = list(db["orders"]), list(db["users"])
    tools = RetailTools(db)
    reads = [
        ("get_order_details", lambda: {"order_id": rng.choice(orders)}),
        ("get_user_details", lambda: {"user_id": rng.choice(users)}),
        ("find_user_id_by_email", lambda: {"email": db["users"][rng.choice(users)]["email"]}),
        ("get_product_details", lambda: {"product_id": rng.choice(list(db["products"]))}),
        ("calculate", lambda: {"expression": "(12.5 + 7.25) * 3"}),
    ]
    calls = [(name, make()) for name, make in (rng.choice(reads) for _ in range(args.calls))]
    it = iter(calls)
    call_rate = per_second(lambda: tools.call(*next(it)), len(calls))

    texts = [f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls[:5000]]
    parse = ToolCallParser().parse
    it_text = iter(texts)
    parse_rate = per_second(lambda: parse(next(it_text)), len(texts))

    reset_rate = per_second(data.db.fresh, 50)
    hash_rate = per_second(lambda: canonical_hash(db), 30)
    tasks = data.split("base")
    it_task = iter(tasks)
    gold_rate = per_second(lambda: replay_gold(data.db, next(it_task)), len(tasks))

    table = Table(title="τ³-Retail environment")
    table.add_column("operation")
    table.add_column("rate", justify="right")
    table.add_column("time each", justify="right")
    for name, rate in [
        ("read tool call (dispatch + checks + JSON out)", call_rate),
        ("parse one <tool_call> turn", parse_rate),
        ("episode reset (private database copy)", reset_rate),
        ("canonical database hash (= score with writes)", hash_rate),
        ("gold replay of one task (copy + actions + hash)", gold_rate),
    ]:
        table.add_row(name, f"{rate:,.0f}/s", f"{1000 / rate:.3f} ms")
    console = Console()
    console.print(table)
    console.print(f"data directory loaded and validated in {load_s:.2f} s; {len(tasks)} tasks")


if __name__ == "__main__":
    main()
