"""``aclarena serve-retriever``: a Search-R1-compatible retrieval server over a JSONL corpus."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from typing import TYPE_CHECKING

from aclarena_slime.cli import CommandError
from aclarena_slime.http_service import LOOPBACK

if TYPE_CHECKING:  # imported when the command runs: `serve-retriever --help` needs neither aiohttp nor numpy
    from aiohttp import web

    from aclarena_envs.search.retriever import Retriever


def register(subparsers: argparse._SubParsersAction) -> None:
    """The plugin's ``serve-retriever`` command; pyproject.toml registers it in the entry-point group ``aclarena_slime.cli``."""
    parser = subparsers.add_parser(
        "serve-retriever",
        help="serve a corpus over Search-R1's retrieval API (POST /retrieve)",
        description=(
            "Serve top-k retrieval over a JSONL corpus ({'id', 'contents'} a line, wiki-18's format) with "
            "Search-R1's API: POST /retrieve {'queries': [...], 'topk': k, 'return_scores': bool}. BM25 by "
            "default (index cached beside the corpus); dense with --e5-model or --encoder (needs faiss-cpu)."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", metavar="FILE", help="JSONL corpus to serve")
    source.add_argument("--demo", action="store_true", help="serve the generated demo corpus (fictional entities)")
    parser.add_argument("--host", default=LOOPBACK, help="interface to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000, Search-R1's; 0 picks a free one)")
    parser.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
    parser.add_argument("--encoder", default=None, metavar="MODULE:FUNC", help="dense retrieval with this encoder")
    parser.add_argument("--e5-model", default=None, metavar="DIR", help="dense retrieval with this E5 model folder")
    parser.add_argument("--dense-index", default=None, metavar="FILE", help="faiss index to read (or write once built)")
    parser.add_argument("--json", action="store_true", help="print the listening URL as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from .config import SearchConfig
    from .env import build_retriever
    from .server import make_app

    try:
        config = SearchConfig.from_mapping(
            {
                "corpus": args.corpus,
                "topk": args.topk,
                "encoder": args.encoder,
                "e5_model": args.e5_model,
                "dense_index": args.dense_index,
            }
        )
        started = time.perf_counter()
        retriever = build_retriever(config)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise CommandError(str(exc)) from exc
    ready_s = time.perf_counter() - started
    try:
        asyncio.run(_serve(make_app(retriever, args.topk), retriever, args, ready_s))
    except OSError as exc:
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    return 0


async def _serve(app: web.Application, retriever: Retriever, args: argparse.Namespace, ready_s: float) -> None:
    from aclarena_slime.http_service import serving

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        async with serving(app, args.host, args.port) as url:
            endpoint = f"{url}/retrieve"
            if args.json:
                print(json.dumps({"url": endpoint, "index_ready_s": round(ready_s, 3)}), flush=True)
            else:
                print(f"aclarena retriever listening on {endpoint} (index ready in {ready_s:.1f} s)", flush=True)
            if args.host != LOOPBACK:
                print(f"warning: listening on {args.host}, reachable from other machines", file=sys.stderr, flush=True)
            await stop.wait()
    finally:
        await retriever.aclose()
