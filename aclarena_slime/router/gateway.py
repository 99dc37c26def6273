"""The HTTP gateway: OpenAI-compatible and native SGLang endpoints in front of an engine pool.

``/v1/chat/completions`` and ``/v1/completions`` get ``model="<served>:<adapter>"``; ``/generate``
gets ``lora_path``; both from the request's environment tag (see :mod:`aclarena_slime.router.routing`).
Bodies are forwarded as JSON, answers (streams included) passed through byte for byte with the
engine's status. ``/health`` reports every engine (503 when none is healthy) and needs no API key;
everything else does when one is configured (``Authorization: Bearer KEY``).
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any

import aiohttp
from aiohttp import web

from aclarena_slime.router.pool import Engine, EnginePool, NoEngine
from aclarena_slime.router.routing import TAG_HEADER, ExpertResolver, Route, RouteError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024  # long multi-turn prompts as token ids stay far below this
ROUTE_HEADER = "X-Aclarena-Expert"  # answers say which expert served them, and how it was chosen
_JSON = {"Content-Type": "application/json"}
_POOL = web.AppKey("pool", EnginePool)
_RESOLVER = web.AppKey("resolver", ExpertResolver)


def build_app(pool: EnginePool, resolver: ExpertResolver, api_key: str | None = None) -> web.Application:
    """The gateway application; the pool starts and stops with it."""
    middlewares = [_errors, _auth(api_key)] if api_key else [_errors]  # each layer costs every request
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=middlewares)
    app[_POOL], app[_RESOLVER] = pool, resolver

    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        await pool.start()
        yield
        await pool.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/chat/completions", _openai)
    app.router.add_post("/v1/completions", _openai)
    app.router.add_post("/generate", _generate)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    return app


def error_response(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except RouteError as exc:
        return error_response(exc.status, str(exc), "invalid_request_error")
    except NoEngine as exc:
        return error_response(503, str(exc), "service_unavailable")


def _auth(api_key: str) -> Any:
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != "/health":
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return error_response(
                    401, "missing or wrong API key (Authorization: Bearer KEY)", "authentication_error"
                )
        return await handler(request)

    return check


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        payload = json.loads(await request.read())  # bytes straight in: no text decoding first
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RouteError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise RouteError("request body must be a JSON object")
    return payload


async def _openai(request: web.Request) -> web.StreamResponse:
    payload = await _json_body(request)
    route, upstream_model = request.app[_RESOLVER].for_openai(payload, request.headers.get(TAG_HEADER))
    payload["model"] = upstream_model
    return await _forward(request, request.path, json.dumps(payload).encode(), route)


async def _generate(request: web.Request) -> web.StreamResponse:
    payload = await _json_body(request)
    route = request.app[_RESOLVER].for_generate(payload, request.headers.get(TAG_HEADER))
    raw = (await request.read()).lstrip()
    if route.source != "lora_path" and route.adapter and payload and "lora_path" not in payload and raw[:1] == b"{":
        # the request as it came, with the adapter spliced in: no second encoding of a long prompt
        body = b'{"lora_path": ' + json.dumps(route.adapter).encode() + b", " + raw[1:]
        return await _forward(request, "/generate", body, route)
    if route.source != "lora_path":
        payload["lora_path"] = route.adapter
    if payload.get("lora_path") is None:
        payload.pop("lora_path", None)
    return await _forward(request, "/generate", json.dumps(payload).encode(), route)


async def _forward(request: web.Request, path: str, body: bytes, route: Route) -> web.StreamResponse:
    """Send ``body`` to the chosen engine; on a refused connection try the next one, on a lost adapter
    reload once. Any other failure of the engine is a JSON 502 and marks it down until its next good
    health check.
    """
    pool = request.app[_POOL]
    tried: set[str] = set()
    reloaded = False
    while True:
        engine = pool.pick(route.needs, exclude=tried)
        with pool.lease(engine):
            try:
                outcome = await _send(request, engine, path, body, route, retry_lost_adapter=not reloaded)
            except aiohttp.ClientConnectorError as exc:  # nothing reached the engine: safe to go elsewhere
                pool.mark_down(engine, f"connection failed: {exc}")
                tried.add(engine.url)
                continue
            except aiohttp.ClientError as exc:  # it had the request (disconnect, reset): resending could run it twice
                pool.mark_down(engine, f"request failed: {type(exc).__name__}: {exc}")
                return error_response(502, f"engine {engine.url} failed the request: {exc}", "bad_gateway")
        if outcome is not None:
            return outcome
        await pool.ensure_adapters(engine, reload=route.adapter)
        reloaded = True


async def _send(
    request: web.Request, engine: Engine, path: str, body: bytes, route: Route, retry_lost_adapter: bool
) -> web.StreamResponse | None:
    """The engine's answer as our response; None when it says the adapter is not loaded (restarted)."""
    pool = request.app[_POOL]
    assert pool.session is not None
    async with pool.session.post(engine.endpoint(path), data=body, headers=_JSON) as upstream:
        route_header = {ROUTE_HEADER: f"{route.adapter or 'base'}; tag={route.tag or '-'}; source={route.source}"}
        if upstream.status == 200 and upstream.content_type == "text/event-stream":
            response = web.StreamResponse(
                status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **route_header}
            )
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except aiohttp.ClientError as exc:  # our headers are out: a cut connection is all the client can get
                pool.mark_down(engine, f"stream broke: {type(exc).__name__}: {exc}")
                raise ConnectionResetError(f"engine {engine.url} broke the stream: {exc}") from exc
            await response.write_eof()
            return response
        data = await upstream.read()
        if upstream.status == 400 and route.adapter and retry_lost_adapter and b"not loaded" in data:
            log.warning("engine %s lost adapter %s; reloading", engine.url, route.adapter)
            return None
        return web.Response(body=data, status=upstream.status, content_type=upstream.content_type, headers=route_header)


async def _models(request: web.Request) -> web.Response:
    resolver = request.app[_RESOLVER]
    names = [resolver.base_name] + [f"{resolver.base_name}:{tag}" for tag in sorted(resolver.table.experts)]
    return web.json_response(
        {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "aclarena"} for n in names]}
    )


async def _health(request: web.Request) -> web.Response:
    status = request.app[_POOL].status()
    return web.json_response(status, status=200 if status["healthy"] else 503)
