"""An HTTP retrieval server that speaks Search-R1's API, over any :class:`Retriever`.

``POST /retrieve {"queries": [...], "topk": k, "return_scores": bool}`` answers
``{"result": [[{"document": {"id", "contents"}, "score": s}, ...] per query]}``, or lists of bare
documents when ``return_scores`` is false — the shapes of Search-R1's
``search_r1/search/retrieval_server.py``, so Search-R1's and slime's example clients work unchanged.
``topk`` may be omitted (the server's default applies). Malformed requests get a 400 with a message.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from .retriever import Retriever, RetrieverError

log = logging.getLogger(__name__)

RETRIEVER_KEY = web.AppKey("retriever", object)
DEFAULT_TOPK_KEY = web.AppKey("default_topk", int)
MAX_TOPK = 1000
MAX_QUERIES = 4096


def _bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": message}), content_type="application/json")


def parse_request(body: Any, default_topk: int) -> tuple[list[str], int, bool]:
    """Validate a ``/retrieve`` body; raises ValueError with a message a client can act on."""
    if not isinstance(body, dict):
        raise ValueError('the body must be a JSON object like {"queries": ["..."], "topk": 3}')
    queries = body.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError('"queries" must be a list of strings')
    if len(queries) > MAX_QUERIES:
        raise ValueError(f"at most {MAX_QUERIES} queries per request, got {len(queries)}")
    topk = body.get("topk")
    if topk is None or topk == 0:  # Search-R1 falls back to its default on a missing or zero topk
        topk = default_topk
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f'"topk" must be an integer from 1 to {MAX_TOPK}, got {topk!r}')
    return_scores = body.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise ValueError(f'"return_scores" must be true or false, got {return_scores!r}')
    return queries, topk, return_scores


async def _retrieve(request: web.Request) -> web.Response:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad_request(f"the body is not valid JSON: {exc}") from None
    try:
        queries, topk, return_scores = parse_request(body, request.app[DEFAULT_TOPK_KEY])
    except ValueError as exc:
        raise _bad_request(str(exc)) from None
    retriever: Retriever = request.app[RETRIEVER_KEY]  # type: ignore[assignment]
    try:
        hits = await retriever.retrieve(queries, topk)
    except RetrieverError as exc:
        log.error("retrieval failed: %s", exc)
        raise web.HTTPBadGateway(text=json.dumps({"error": str(exc)}), content_type="application/json") from None
    if return_scores:
        result = [[{"document": dict(h.document), "score": h.score} for h in row] for row in hits]
    else:
        result = [[dict(h.document) for h in row] for row in hits]
    return web.json_response({"result": result})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app(retriever: Retriever, default_topk: int = 3) -> web.Application:
    """The aiohttp application; the caller owns the retriever and closes it."""
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app[RETRIEVER_KEY] = retriever
    app[DEFAULT_TOPK_KEY] = default_topk
    app.router.add_post("/retrieve", _retrieve)
    app.router.add_get("/health", _health)
    return app
