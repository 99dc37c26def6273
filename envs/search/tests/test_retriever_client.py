"""The remote retriever's client under a flaky or hostile server (issue 44, section 5): a reset connection is
retried with back-off, a give-up is logged and counted, and a reply is read only up to a byte cap."""

from __future__ import annotations

import json
import logging

import pytest
from aiohttp import web

from aclarena_envs.search.config import SearchConfig
from aclarena_envs.search.env import build_retriever
from aclarena_envs.search.retriever import RemoteRetriever, RetrieverError
from aclarena_slime.http_service import serving

ONE_HIT = {"result": [[{"document": {"id": "1", "contents": "Paris\nParis is the capital of France."}, "score": 1.0}]]}


def _app(handler) -> web.Application:
    app = web.Application()
    app.router.add_post("/retrieve", handler)
    return app


async def test_a_reset_connection_is_retried_and_the_search_succeeds():
    """Today one reset connection aborts the episode and its sample is removed."""
    calls = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        if calls <= 2:  # the server drops the connection without an answer (a restart, an overloaded proxy)
            request.transport.close()
            return web.Response()
        return web.json_response(ONE_HIT)

    async with serving(_app(handler)) as url:
        remote = RemoteRetriever(url, backoff_s=0.01)
        try:
            [hits] = await remote.retrieve(["capital of France"], 1)
        finally:
            await remote.aclose()
    assert calls == 3 and hits[0].document["id"] == "1"


async def test_a_retriever_that_stays_down_fails_after_bounded_retries_and_says_so(caplog):
    remote = RemoteRetriever("http://127.0.0.1:9", retries=2, backoff_s=0.01)  # nothing listens there
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(RetrieverError, match="after 3 attempts"):
            await remote.retrieve(["q"], 1)
        with pytest.raises(RetrieverError):
            await remote.retrieve(["q"], 1)
    finally:
        await remote.aclose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "2 searches failed so far" in warnings[-1]
    assert remote.failures == 2


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_oversized_reply_is_refused_at_the_cap_without_reading_it_whole(chunked: bool):
    """A 20 MB passage was read and tokenized whole; now the client stops at its cap (here 64 KiB)."""
    sent = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        body = json.dumps({"result": [[{"document": {"id": "1", "contents": "x" * (20 << 20)}}]]}).encode()
        if not chunked:
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for start in range(0, len(body), 1 << 16):
            try:
                await resp.write(body[start : start + (1 << 16)])
            except (ConnectionResetError, OSError):
                break
            sent += 1 << 16
        return resp

    async with serving(_app(handler)) as url:
        remote = RemoteRetriever(url, max_bytes=1 << 16, retries=0)
        try:
            with pytest.raises(RetrieverError, match=r"more than 65536 bytes"):
                await remote.retrieve(["q"], 1)
        finally:
            await remote.aclose()
    if chunked:
        assert sent < (20 << 20)


def test_the_env_config_sets_the_clients_bounds():
    cfg = SearchConfig.from_mapping({"retriever_url": "http://h:1/retrieve", "retriever_retries": 5,
                                     "retriever_max_bytes": 1000})  # fmt: skip
    remote = build_retriever(cfg)
    assert (remote.retries, remote.max_bytes) == (5, 1000)
    with pytest.raises(ValueError, match="retriever_max_bytes"):
        SearchConfig.from_mapping({"retriever_url": "http://h:1/retrieve", "retriever_max_bytes": 0})
