"""The LLM user simulator's client reads a bounded reply and says when it gives up (issue 44, section 5)."""

from __future__ import annotations

import json
import logging

import pytest
from aiohttp import web

from aclarena_envs.retail.user_sim import LLMUser, build_user_simulator
from aclarena_slime.http_service import serving
from aclarena_slime.plugin.contract import EpisodeAborted


def _app(body: bytes) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()  # no Content-Length: the cap must hold while reading
        await resp.prepare(request)
        for start in range(0, len(body), 1 << 16):
            try:
                await resp.write(body[start : start + (1 << 16)])
            except (ConnectionResetError, OSError):
                break
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    return app


def _reply(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}).encode()


async def test_a_20_mb_reply_is_refused_at_the_cap():
    """Today the whole reply is read, decoded and later tokenized on the rollout's event loop."""
    async with serving(_app(_reply("y" * (20 << 20)))) as url:
        sim = build_user_simulator({"kind": "llm", "base_url": f"{url}/v1", "model": "m", "retries": 0,
                                    "max_reply_bytes": 1 << 20})  # fmt: skip
        try:
            with pytest.raises(EpisodeAborted, match=r"more than 1048576 bytes"):
                await sim.session("s").reply("hello")
        finally:
            await sim.aclose()


async def test_a_reply_under_the_cap_is_read_as_before():
    async with serving(_app(_reply("Hi, I need to return an order."))) as url:
        sim = build_user_simulator({"kind": "llm", "base_url": f"{url}/v1", "model": "m"})
        try:
            assert await sim.session("s").reply("hello") == "Hi, I need to return an order."
        finally:
            await sim.aclose()


async def test_a_simulator_that_is_down_is_logged_and_counted(caplog):
    sim = LLMUser("http://127.0.0.1:9/v1", "m", retries=1, backoff_s=0.01)  # nothing listens there
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(2):
                with pytest.raises(EpisodeAborted, match="failed after 2 attempts"):
                    await sim.session("s").reply("hello")
    finally:
        await sim.aclose()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "2 replies failed so far" in warnings[-1] and sim.failures == 2


def test_the_cap_is_checked():
    with pytest.raises(ValueError, match="max_reply_bytes"):
        build_user_simulator({"kind": "llm", "base_url": "http://h/v1", "model": "m", "max_reply_bytes": 0})
