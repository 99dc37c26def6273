"""``aclarena serve-router``: the multi-LoRA gateway in front of SGLang engines (env tag → expert)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aclarena_slime.cli import CommandError
from aclarena_slime.http_service import LOOPBACK

if TYPE_CHECKING:  # the router (httptools, numpy) is imported when the command runs, not for `aclarena --help`
    from aclarena_slime.router.classifier import TagClassifier
    from aclarena_slime.router.gateway import Gateway

# The value of aclarena_slime.router.routing.TAG_HEADER, written out so that --help does not import the
# router; tests/cli/test_startup.py checks that the two agree.
TAG_HEADER = "X-Aclarena-Env"
API_KEY_ENV = "ACLARENA_ROUTER_API_KEY"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve-router",
        help="serve the multi-LoRA gateway (env tag -> LoRA expert) in front of SGLang engines",
        description=(
            "An HTTP gateway in front of SGLang engines: OpenAI-compatible /v1/chat/completions and "
            f"/v1/completions (expert from model='<base>:<tag>' or the {TAG_HEADER} header) and native "
            "/generate (lora_path filled in from the tag). Loads every expert of the manifest on every "
            "engine, again after an engine restarts; spreads load; answers 503 when no engine is healthy."
        ),
    )
    parser.add_argument("--engine", action="append", required=True, metavar="URL", help="an SGLang server (repeat)")
    parser.add_argument("--experts", required=True, metavar="FILE", help="expert manifest (experts.json)")
    parser.add_argument("--host", default=LOOPBACK, help="interface to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port (0 picks a free one; the URL is printed)")
    parser.add_argument("--api-key", default=None, help=f"require 'Authorization: Bearer KEY' (or set ${API_KEY_ENV})")
    parser.add_argument(
        "--classifier",
        default=None,
        metavar="FILE|builtin",
        help="pick the expert of untagged requests from the prompt: a saved classifier, or 'builtin' "
        "(trained at start on the routing prompts of the manifest's env plugins)",
    )
    parser.add_argument("--min-confidence", type=float, default=0.5, help="classifier probability needed to use it")
    parser.add_argument("--health-interval", type=float, default=5.0, help="seconds between engine health checks")
    limits = parser.add_argument_group("limits (every wait is bounded; what they do is logged)")
    limits.add_argument("--header-timeout", type=float, default=10.0, help="seconds a client has to send its headers")
    limits.add_argument("--body-timeout", type=float, default=60.0, help="seconds a client has to send its body")
    limits.add_argument("--max-connections", type=int, default=4096, help="client connections held at once "
                        "(lowered to fit the descriptor limit)")
    limits.add_argument("--upstream-timeout", type=float, default=600.0, help="seconds an engine may send nothing "
                        "about a request (a non-streamed answer comes when generation ends)")
    limits.add_argument("--stalled-hold", type=float, default=60.0, help="seconds an engine that timed out is "
                        "kept out of rotation, whatever its /health says")
    parser.set_defaults(handler=run)


def load_classifier(spec: str | None, tags: Iterable[str]) -> TagClassifier | None:
    """A saved classifier, or ``builtin``: one trained now on the routing prompts of the env plugins of ``tags``."""
    from aclarena_slime.plugin.registry import PluginLoadError, UnknownEnvironment
    from aclarena_slime.router.classifier import TagClassifier
    from aclarena_slime.router.tag_prompts import labelled_prompts

    if spec is None:
        return None
    if spec == "builtin":
        try:
            pairs = labelled_prompts(tags, 300, seed=0)
        except (UnknownEnvironment, PluginLoadError, TypeError, ValueError, NotImplementedError) as exc:
            raise CommandError(f"--classifier builtin: {exc}") from exc
        return TagClassifier.train([text for text, _ in pairs], [tag for _, tag in pairs])
    try:
        return TagClassifier.load(spec)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc


def run(args: argparse.Namespace) -> int:
    from aclarena_slime.experts import ExpertError, ExpertTable
    from aclarena_slime.router.gateway import GatewaySettings, build_app
    from aclarena_slime.router.gateway import run as run_loop
    from aclarena_slime.router.pool import EnginePool
    from aclarena_slime.router.routing import ExpertResolver

    try:
        table = ExpertTable.load(args.experts)
    except ExpertError as exc:
        raise CommandError(str(exc)) from exc
    if not table.experts:
        raise CommandError(f"expert manifest {args.experts} names no experts")
    for url in args.engine:
        if not url.startswith(("http://", "https://")):
            raise CommandError(f"--engine {url!r} is not an http(s) URL")
    classifier = load_classifier(args.classifier, sorted(table.experts))
    resolver = ExpertResolver(table, classifier, min_confidence=args.min_confidence)
    try:
        settings = GatewaySettings(
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            max_connections=args.max_connections,
            upstream_timeout_s=args.upstream_timeout,
            stalled_hold_s=args.stalled_hold,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    pool = EnginePool(args.engine, table, health_interval_s=args.health_interval)
    app = build_app(pool, resolver, api_key=args.api_key or os.environ.get(API_KEY_ENV), settings=settings)
    try:
        run_loop(_serve(app, args.host, args.port))
    except OSError as exc:
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    return 0


async def _serve(app: Gateway, host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with app.serving(host, port) as url:
        print(f"aclarena router listening on {url}", flush=True)
        if host != LOOPBACK:
            print(f"warning: listening on {host}, reachable from other machines", file=sys.stderr, flush=True)
        await stop.wait()
