"""The HTTP gateway: OpenAI-compatible and native SGLang endpoints in front of an engine pool.

``/v1/chat/completions`` and ``/v1/completions`` get ``model="<served>:<adapter>"``; ``/generate``
gets ``lora_path``; both from the request's environment tag (see :mod:`aclarena_slime.router.routing`).
Bodies are forwarded as JSON (a tagged ``/generate`` that names no adapter is not even decoded: the
engine parses it), answers (streams included) passed through byte for byte with the engine's status. ``/health`` reports every engine (503 when none is healthy) and needs no API key;
everything else does when one is configured (``Authorization: Bearer KEY``).

The HTTP both ways is :mod:`aclarena_slime.router.http1` (asyncio protocols, httptools), on uvloop when
it is installed: the proxy path is the gateway's whole cost when engines are fast. :class:`GatewaySettings`
bounds what a client may hold (read deadlines, a connection cap) and how long an engine may stay silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import resource
import socket
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from aclarena_slime.http_service import LOOPBACK
from aclarena_slime.router.http1 import (
    ClientLimits,
    ConnectionTable,
    Request,
    ServerConnection,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeout,
)
from aclarena_slime.router.pool import Engine, EnginePool, NoEngine
from aclarena_slime.router.routing import TAG_HEADER, ExpertResolver, Route, RouteError
from aclarena_slime.sglang_errors import is_adapter_missing

log = logging.getLogger(__name__)

ROUTE_HEADER = "X-Aclarena-Expert"  # answers say which expert served them, and how it was chosen
_FDS_PER_CLIENT = 2  # a client's connection and, while its request runs, one to an engine
_FDS_SPARE = 64  # listening socket, health checks, adapter loads, logs
# What an engine says when it lacks an adapter a request names: our fake and local engines ("... not
# loaded"); SGLang 0.5.15 (srt/managers/tokenizer_manager.py, _resolve_lora_path, a 400): a restarted
# server ("Got LoRA adapter that has never been loaded: NAME"), and one whose implicit reload of an
# unloaded adapter failed, its folder gone ("Failed to implicitly load LoRA adapter NAME: ...").
_JSON = "application/json"
_TAG = TAG_HEADER.lower()
T = TypeVar("T")


@dataclass(frozen=True)
class GatewaySettings:
    """The gateway's limits (``aclarena serve-router`` flags). Every wait is bounded: a slow or silent
    peer on either side costs one connection for a bounded time, and what the limits do is logged."""

    max_body_bytes: int = 64 * 1024 * 1024  # long multi-turn prompts as token ids stay far below this
    header_timeout_s: float = 10.0  # a request's first byte to the end of its headers
    body_timeout_s: float = 60.0  # the end of the headers to the end of the body (64 MB at ~1 MB/s)
    idle_timeout_s: float = 75.0  # a keep-alive connection with no request for this long is closed
    max_connections: int = 4096  # lowered at start to what the process's descriptor limit allows
    # The longest an engine may send nothing about a request: a non-streamed answer starts only when the
    # whole generation is done, so this bounds a generation's length too. An engine that times out is
    # marked down and kept out of rotation for stalled_hold_s (its /health may well answer meanwhile).
    upstream_timeout_s: float = 600.0
    stalled_hold_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s", "upstream_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"gateway setting {name} must be > 0, got {getattr(self, name)}")
        if self.max_body_bytes < 1 or self.max_connections < 1 or self.stalled_hold_s < 0:
            raise ValueError(f"gateway settings out of range: {self}")

    def client_limits(self) -> ClientLimits:
        """The limits with the connection cap lowered to fit the descriptor limit (so the cap, which is
        logged and answered with a 503, bites before ``accept`` fails with EMFILE, which is neither)."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = self.max_connections
        if soft != resource.RLIM_INFINITY:
            fitting = max(1, (soft - _FDS_SPARE) // _FDS_PER_CLIENT)
            if fitting < cap:
                log.warning("gateway: connection cap lowered from %d to %d to fit the descriptor limit %d",
                            cap, fitting, soft)
                cap = fitting
        return ClientLimits(self.max_body_bytes, self.header_timeout_s, self.body_timeout_s, self.idle_timeout_s, cap)


class Gateway:
    """The gateway's routes over an :class:`EnginePool`; ``async with gateway.serving(host, port) as url``."""

    def __init__(
        self,
        pool: EnginePool,
        resolver: ExpertResolver,
        api_key: str | None = None,
        settings: GatewaySettings | None = None,
    ) -> None:
        self.pool, self.resolver = pool, resolver
        self.settings = settings or GatewaySettings()
        self._expected = f"Bearer {api_key}".encode() if api_key else None
        self._routes = {
            "/v1/chat/completions": ("POST", self._openai),
            "/v1/completions": ("POST", self._openai),
            "/generate": ("POST", self._generate),
            "/v1/models": ("GET", self._models),
            "/health": ("GET", self._health),
        }
        self._table: ConnectionTable | None = None

    @contextlib.asynccontextmanager
    async def serving(self, host: str = LOOPBACK, port: int = 0) -> AsyncIterator[str]:
        """Serve for the duration of the block; yields the base URL (``port=0`` picks a free port, bound
        before the URL is handed out)."""
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        table = self._table = ConnectionTable(self.settings.client_limits())
        await self.pool.start()
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(lambda: ServerConnection(self._handle, table), sock=sock)
        except BaseException:
            await self.pool.close()
            raise
        sweeper = loop.create_task(self._sweep(table))
        try:
            yield f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"
        finally:
            sweeper.cancel()
            server.close()
            for conn in list(table.open):
                conn.abort()
            await server.wait_closed()
            await self.pool.close()

    async def _sweep(self, table: ConnectionTable) -> None:
        """Once in a while, rather than a timer per request: slow requests get a 408, idle connections are
        closed, and what the limits did since the last pass is logged in one line."""
        limits = table.limits
        interval = min(limits.header_timeout_s, limits.body_timeout_s, limits.idle_timeout_s) / 4
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            table.sweep(loop.time())
            counts = table.take_counts()
            if counts:
                log.warning(
                    "gateway: client connections %s (%d open, cap %d)",
                    ", ".join(f"{why}: {n}" for why, n in sorted(counts.items())),
                    len(table.open),
                    limits.max_connections,
                )

    async def _handle(self, conn: ServerConnection, request: Request) -> None:
        """Dispatch, check the key, and turn routing failures into JSON errors."""
        method, handler = self._routes.get(request.path, (None, None))
        if handler is None:
            return _error(conn, request, 404, f"no route {request.path}", "not_found")
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            return _error(conn, request, 405, f"{request.path} takes {method}", "method_not_allowed")
        if self._expected is not None and request.path != "/health":
            given = request.headers.get("authorization", "").encode("latin-1")
            if not hmac.compare_digest(given, self._expected):
                return _error(
                    conn, request, 401, "missing or wrong API key (Authorization: Bearer KEY)", "authentication_error"
                )
        try:
            await handler(conn, request)
        except RouteError as exc:
            _error(conn, request, exc.status, str(exc), "invalid_request_error")
        except NoEngine as exc:
            _error(conn, request, 503, str(exc), "service_unavailable")
        except Exception:  # a bug of ours: the client gets a 500, the log the traceback, the server goes on
            log.exception("gateway failed on %s %s", request.method, request.path)
            _error(conn, request, 500, "internal gateway error (see the gateway's log)", "internal_error")

    async def _openai(self, conn: ServerConnection, request: Request) -> None:
        payload = _json_body(request.body)
        route, upstream_model = self.resolver.for_openai(payload, request.headers.get(_TAG))
        payload["model"] = upstream_model
        await self._forward(conn, request, json.dumps(payload).encode(), route)

    async def _generate(self, conn: ServerConnection, request: Request) -> None:
        tag, raw = request.headers.get(_TAG), request.body.lstrip()
        if tag and raw[:1] == b"{" and raw[1:].lstrip()[:1] not in (b"}", b"") and not _may_name_lora_path(raw):
            # Tagged and naming no adapter of its own: the header decides, so the body is not decoded (1.3 ms
            # for 8k token ids); it goes on with the adapter spliced in, and the engine parses it as ever.
            route = self.resolver.for_generate({}, tag)
            body = b'{"lora_path": ' + json.dumps(route.adapter).encode() + b", " + raw[1:]
            return await self._forward(conn, request, body, route)
        payload = _json_body(request.body)
        route = self.resolver.for_generate(payload, tag)
        if route.source != "lora_path" and route.adapter and payload and "lora_path" not in payload and raw[:1] == b"{":
            # the request as it came, with the adapter spliced in: no second encoding of a long prompt
            body = b'{"lora_path": ' + json.dumps(route.adapter).encode() + b", " + raw[1:]
            return await self._forward(conn, request, body, route)
        if route.source != "lora_path":
            payload["lora_path"] = route.adapter
        if payload.get("lora_path") is None:
            payload.pop("lora_path", None)
        await self._forward(conn, request, json.dumps(payload).encode(), route)

    async def _forward(self, conn: ServerConnection, request: Request, body: bytes, route: Route) -> None:
        """Send ``body`` to the chosen engine; on a refused connection try the next one, on a lost adapter
        reload once. Any other failure of the engine is a JSON 502 and marks it down until its next good
        health check.
        """
        tried: set[str] = set()
        reloaded = False
        while True:
            engine = self.pool.pick(route.needs, exclude=tried)
            with self.pool.lease(engine):
                try:
                    answered = await self._send(conn, request, engine, body, route, retry_lost_adapter=not reloaded)
                except UpstreamConnectError as exc:  # nothing reached the engine: safe to go elsewhere
                    self.pool.mark_down(engine, f"connection failed: {exc}")
                    tried.add(engine.url)
                    continue
                except UpstreamTimeout as exc:  # stalled: /health may still answer, so it is held out a while
                    self.pool.mark_down(engine, f"request timed out: {exc}", hold_s=self.settings.stalled_hold_s)
                    return _error(conn, request, 504, f"engine {engine.url} timed out: {exc}", "gateway_timeout")
                except UpstreamError as exc:  # it had the request: resending could run it twice
                    self.pool.mark_down(engine, f"request failed: {exc}")
                    return _error(conn, request, 502, f"engine {engine.url} failed the request: {exc}", "bad_gateway")
            if answered:
                return
            await self.pool.ensure_adapters(engine, reload=route.adapter)
            reloaded = True

    async def _send(
        self,
        conn: ServerConnection,
        request: Request,
        engine: Engine,
        body: bytes,
        route: Route,
        retry_lost_adapter: bool,
    ) -> bool:
        """The engine's answer to the client; False when it says the adapter is not loaded (restarted)."""
        connections = engine.connections
        upstream = await connections.acquire()
        complete = False
        try:
            await upstream.send(connections.head(request.path, len(body)) + body, self.settings.upstream_timeout_s)
            route_header = {ROUTE_HEADER: f"{route.adapter or 'base'}; tag={route.tag or '-'}; source={route.source}"}
            if upstream.status == 200 and upstream.content_type.startswith("text/event-stream"):
                await self._stream(conn, request, engine, upstream, route_header)
                complete = not upstream.closed
                return True
            await upstream.finished()
            complete = True
            data = upstream.take_body()
            if route.adapter and retry_lost_adapter and is_adapter_missing(upstream.status, data.decode(errors="replace")):
                log.warning("engine %s lost adapter %s; reloading", engine.url, route.adapter)
                return False
            conn.respond(request, upstream.status, data, upstream.content_type or _JSON, route_header)
            return True
        finally:
            connections.release(upstream, complete)

    async def _stream(
        self, conn: ServerConnection, request: Request, engine: Engine, upstream: Any, route_header: dict[str, str]
    ) -> None:
        """Server-sent events, each piece written on as it arrives; a slow client slows the engine's socket."""
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **route_header}
        conn.start_stream(request, 200, headers)
        for piece in upstream.body:
            conn.write_piece(piece)
        upstream.body = []
        upstream.sink = conn.write_piece
        conn.on_pause = upstream.pause
        try:
            await upstream.finished()
        except UpstreamError as exc:  # our headers are out: a cut connection is all the client can get
            hold_s = self.settings.stalled_hold_s if isinstance(exc, UpstreamTimeout) else 0.0
            self.pool.mark_down(engine, f"stream broke: {exc}", hold_s=hold_s)
            conn.abort()
            return
        finally:
            conn.on_pause = None
        conn.end_stream()

    async def _models(self, conn: ServerConnection, request: Request) -> None:
        names = [self.resolver.base_name] + [
            f"{self.resolver.base_name}:{t}" for t in sorted(self.resolver.table.experts)
        ]
        models = [{"id": n, "object": "model", "owned_by": "aclarena"} for n in names]
        conn.respond(request, 200, json.dumps({"object": "list", "data": models}).encode(), _JSON)

    async def _health(self, conn: ServerConnection, request: Request) -> None:
        status = self.pool.status()
        conn.respond(request, 200 if status["healthy"] else 503, json.dumps(status).encode(), _JSON)


def build_app(
    pool: EnginePool, resolver: ExpertResolver, api_key: str | None = None, settings: GatewaySettings | None = None
) -> Gateway:
    """The gateway; the pool starts and stops with :meth:`Gateway.serving`."""
    return Gateway(pool, resolver, api_key, settings)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop when it is installed (less CPU per proxied request), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body)  # bytes straight in: no text decoding first
    except RecursionError as exc:
        raise RouteError("request body is not valid JSON here: it nests deeper than the parser allows") from exc
    except ValueError as exc:  # malformed, not UTF-8, or an integer over Python's 4300-digit conversion limit
        raise RouteError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise RouteError("request body must be a JSON object")
    return payload


def _error(conn: ServerConnection, request: Request, status: int, message: str, kind: str) -> None:
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    conn.respond(request, status, body, _JSON)



def _may_name_lora_path(raw: bytes) -> bool:
    """Whether a JSON body could hold a ``lora_path`` key: spelled out, or hidden behind a ``\\u`` escape."""
    return b'"lora_path"' in raw or b"\\u" in raw
