"""The SGLang client: bounded retries on connection errors and 5xx, none on 4xx, server messages kept."""

from __future__ import annotations

import socket

import pytest
from aiohttp import web

from aclarena_slime.http_service import serving
from aclarena_slime.sglang_client import (
    RetryPolicy,
    SGLangClient,
    SGLangError,
    finish_reason,
    new_session,
    output_tokens,
)

FAST = RetryPolicy(attempts=3, backoff_s=0.01)


def _app(statuses: list[int], seen: list[dict]) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        seen.append(await request.json())
        status = statuses.pop(0) if statuses else 200
        if status != 200:
            return web.json_response({"error": {"message": f"planned {status}"}}, status=status)
        return web.json_response(
            {"text": "ok", "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[-0.5, 7, None]]}}
        )

    app = web.Application()
    app.router.add_post("/generate", generate)
    return app


async def test_5xx_is_retried_then_succeeds():
    seen: list[dict] = []
    async with serving(_app([503, 500], seen)) as url:
        out = await SGLangClient(url, retry=FAST).generate([1, 2], {"max_new_tokens": 4}, lora_path="math")
    assert len(seen) == 3 and seen[0]["lora_path"] == "math" and seen[0]["return_logprob"] is True
    assert output_tokens(out) == ([7], [-0.5]) and finish_reason(out) == "stop"


async def test_4xx_is_not_retried_and_carries_the_message():
    seen: list[dict] = []
    async with serving(_app([400], seen)) as url:
        with pytest.raises(SGLangError, match="planned 400") as info:
            await SGLangClient(url, retry=FAST).generate([1], {})
    assert info.value.status == 400 and len(seen) == 1


async def test_persistent_5xx_gives_up_after_the_bound():
    seen: list[dict] = []
    async with serving(_app([502] * 10, seen)) as url:
        with pytest.raises(SGLangError, match="planned 502"):
            await SGLangClient(url, retry=FAST).generate([1], {})
    assert len(seen) == FAST.attempts


async def test_connection_refused_is_retried_then_raised():
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = SGLangClient(f"http://127.0.0.1:{port}", retry=FAST)
    with pytest.raises(SGLangError, match="no answer"):
        await client.generate([1], {})
    assert not await client.healthy()


async def _peers_of_five_requests(session_for_client) -> set:
    peers: set = set()

    async def generate(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername"))
        return web.json_response({"text": "", "meta_info": {}})

    app = web.Application()
    app.router.add_post("/generate", generate)
    async with serving(app) as url:
        client = SGLangClient(url, session=session_for_client)
        for _ in range(5):
            await client.generate([1], {})
    return peers


async def test_a_given_session_reuses_its_connection_across_requests():
    async with new_session() as session:
        assert len(await _peers_of_five_requests(session)) == 1
    assert session.closed  # its owner closed it; the client holds no session of its own


async def test_without_a_session_each_request_opens_and_closes_its_own():
    assert len(await _peers_of_five_requests(None)) == 5
