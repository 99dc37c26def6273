"""Retrieval throughput of the search env: BM25 embedded and through ``aclarena serve-retriever``.

    .venv/bin/python benchmarks/bench_retrieval.py [--passages 100000] [--queries 1000] [--batch 64]

Generates the fictional demo corpus (``--passages`` passages, seeded), builds its BM25 index (timed,
then reloaded from the on-disk cache, timed), and measures queries per second at top-3: embedded
(one query a call, and batches), and through the HTTP server started as a separate process (one
query a request, 8 requests in flight as concurrent episodes send them, and batches). The last
column is the server's rate over the embedded one in the same mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

from aclarena_envs.search.demo_corpus import generate, write_jsonl
from aclarena_envs.search.retriever import BM25Retriever


def _batches(queries: Sequence[str], size: int) -> list[list[str]]:
    return [list(queries[i : i + size]) for i in range(0, len(queries), size)]


def embedded_rate(retriever: BM25Retriever, queries: Sequence[str], batch: int, topk: int) -> float:
    start = time.perf_counter()
    for chunk in _batches(queries, batch):
        retriever.search(chunk, topk)
    return len(queries) / (time.perf_counter() - start)


async def embedded_concurrent_rate(
    retriever: BM25Retriever, queries: Sequence[str], topk: int, in_flight: int
) -> float:
    """As the env calls it: ``await retrieve([q])`` from concurrent episodes (a worker thread each)."""
    gate = asyncio.Semaphore(in_flight)

    async def one(query: str) -> None:
        async with gate:
            await retriever.retrieve([query], topk)

    start = time.perf_counter()
    await asyncio.gather(*(one(q) for q in queries))
    return len(queries) / (time.perf_counter() - start)


async def server_rate(url: str, queries: Sequence[str], batch: int, topk: int, in_flight: int = 1) -> float:
    chunks = _batches(queries, batch)
    gate = asyncio.Semaphore(in_flight)
    async with aiohttp.ClientSession() as session:

        async def one(chunk: list[str]) -> None:
            async with gate, session.post(url, json={"queries": chunk, "topk": topk, "return_scores": True}) as resp:
                body = await resp.json()
                assert resp.status == 200 and len(body["result"]) == len(chunk), body

        await one(chunks[0])  # warm the connection
        start = time.perf_counter()
        await asyncio.gather(*(one(c) for c in chunks))
        return len(queries) / (time.perf_counter() - start)


def start_server(corpus: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "aclarena_slime", "serve-retriever", "--corpus", str(corpus), "--port", "0", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError("serve-retriever did not start")
    return proc, json.loads(line)["url"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--topk", type=int, default=3)
    args = parser.parse_args()

    demo = generate(args.passages, seed=0)
    questions = [q.question for q in demo.questions]
    queries = [questions[(i * 7919) % len(questions)] for i in range(args.queries)]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_jsonl(demo.passages, Path(tmp) / "corpus.jsonl")
        start = time.perf_counter()
        BM25Retriever.from_corpus(corpus)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        retriever = BM25Retriever.from_corpus(corpus)
        load_s = time.perf_counter() - start

        embedded = {
            "single": embedded_rate(retriever, queries, 1, args.topk),
            "batch": embedded_rate(retriever, queries, args.batch, args.topk),
        }
        embedded["single, 8 in flight"] = asyncio.run(embedded_concurrent_rate(retriever, queries, args.topk, 8))
        proc, url = start_server(corpus)
        try:
            served = {
                "single": asyncio.run(server_rate(url, queries, 1, args.topk)),
                "single, 8 in flight": asyncio.run(server_rate(url, queries, 1, args.topk, in_flight=8)),
                "batch": asyncio.run(server_rate(url, queries, args.batch, args.topk)),
            }
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    table = Table(title=f"BM25 retrieval, {args.passages:,} passages, top-{args.topk}, {args.queries:,} queries")
    for column in ("mode", "embedded q/s", "server q/s", "server / embedded"):
        table.add_column(column, justify="right" if column != "mode" else "left")
    for mode in ("single", "single, 8 in flight", "batch"):
        label = mode if mode != "batch" else f"batch of {args.batch}"
        table.add_row(label, f"{embedded[mode]:.0f}", f"{served[mode]:.0f}", f"{served[mode] / embedded[mode]:.2f}")
    console = Console()
    console.print(table)
    console.print(f"index build (cold): {build_s:.1f} s; load from the cache beside the corpus: {load_s:.2f} s")


if __name__ == "__main__":
    main()
