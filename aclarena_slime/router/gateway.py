"""The HTTP gateway: OpenAI-compatible and native SGLang endpoints in front of an engine pool.

``/v1/chat/completions`` and ``/v1/completions`` get ``model="<served>:<adapter>"``; ``/generate``
gets ``lora_path``; both from the request's environment tag (see :mod:`aclarena_slime.router.routing`).
Bodies are forwarded as JSON (a tagged ``/generate`` that names no adapter is not even decoded: the
engine parses it), answers (streams included) passed through byte for byte with the engine's status. ``/health`` reports every engine (503 when none is healthy) and needs no API key;
everything else does when one is configured (``Authorization: Bearer KEY``).

The HTTP both ways is :mod:`aclarena_slime.router.http1` (asyncio protocols, httptools), on uvloop when
it is installed: the proxy path is the gateway's whole cost when engines are fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from aclarena_slime.http_service import LOOPBACK
from aclarena_slime.router.http1 import Request, ServerConnection, UpstreamConnectError, UpstreamError
from aclarena_slime.router.pool import Engine, EnginePool, NoEngine
from aclarena_slime.router.routing import TAG_HEADER, ExpertResolver, Route, RouteError
from aclarena_slime.sglang_errors import is_adapter_missing

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024  # long multi-turn prompts as token ids stay far below this
ROUTE_HEADER = "X-Aclarena-Expert"  # answers say which expert served them, and how it was chosen
IDLE_CLIENT_S = 75.0  # a client's keep-alive connection with no request for this long is closed
_JSON = "application/json"
_TAG = TAG_HEADER.lower()
T = TypeVar("T")


class Gateway:
    """The gateway's routes over an :class:`EnginePool`; ``async with gateway.serving(host, port) as url``."""

    def __init__(self, pool: EnginePool, resolver: ExpertResolver, api_key: str | None = None) -> None:
        self.pool, self.resolver = pool, resolver
        self._expected = f"Bearer {api_key}".encode() if api_key else None
        self._routes = {
            "/v1/chat/completions": ("POST", self._openai),
            "/v1/completions": ("POST", self._openai),
            "/generate": ("POST", self._generate),
            "/v1/models": ("GET", self._models),
            "/health": ("GET", self._health),
        }
        self._connections: set[ServerConnection] = set()

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
        await self.pool.start()
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(
                lambda: ServerConnection(self._handle, MAX_BODY_BYTES, self._connections), sock=sock
            )
        except BaseException:
            await self.pool.close()
            raise
        sweeper = loop.create_task(self._close_idle())
        try:
            yield f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"
        finally:
            sweeper.cancel()
            server.close()
            for conn in list(self._connections):
                conn.abort()
            await server.wait_closed()
            await self.pool.close()

    async def _close_idle(self) -> None:
        """Once in a while, rather than a timer per request."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(IDLE_CLIENT_S / 4)
            for conn in list(self._connections):
                if conn.task is None and loop.time() - conn.last_active > IDLE_CLIENT_S and conn.transport:
                    conn.transport.close()

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
            await upstream.send(connections.head(request.path, len(body)) + body)
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
            self.pool.mark_down(engine, f"stream broke: {exc}")
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


def build_app(pool: EnginePool, resolver: ExpertResolver, api_key: str | None = None) -> Gateway:
    """The gateway; the pool starts and stops with :meth:`Gateway.serving`."""
    return Gateway(pool, resolver, api_key)


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
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
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
