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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_default_patience_is_slimes():
    """slime's generate retries 60 times, 1 s apart (slime/utils/http_utils.py ``_post``, slime 624b824)."""
    policy = RetryPolicy()
    assert (policy.attempts, policy.backoff_s, policy.max_backoff_s) == (60, 1.0, 1.0)
    assert policy.read_timeout_s is not None, "an engine that never answers must not hang a rollout"


@pytest.mark.slow
async def test_an_engine_down_for_four_seconds_loses_no_request():
    """The fault-injection finding: an engine restarted 5 s after kill -9 failed the samples in flight (the old
    policy gave up after 0.5 + 1 + 2 s)."""
    import asyncio

    port = _free_port()
    seen: list[dict] = []

    async def restart_later() -> None:
        await asyncio.sleep(4.0)
        async with serving(_app([], seen), port=port):
            await asyncio.sleep(3.0)

    engine = asyncio.ensure_future(restart_later())
    try:
        out = await SGLangClient(f"http://127.0.0.1:{port}").generate([1], {})
    finally:
        engine.cancel()
    assert output_tokens(out) == ([7], [-0.5]) and len(seen) == 1


async def test_a_200_that_is_not_json_is_an_error_naming_the_engine():
    async def generate(request: web.Request) -> web.Response:
        return web.Response(text="<html>502 Bad Gateway</html>", content_type="text/html")

    app = web.Application()
    app.router.add_post("/generate", generate)
    async with serving(app) as url:
        with pytest.raises(SGLangError, match="not a JSON object") as info:
            await SGLangClient(url, retry=FAST).generate([1], {})
    assert url in str(info.value) and "502 Bad Gateway" in str(info.value)


async def test_an_engine_that_accepts_and_never_answers_fails_the_request_in_bounded_time():
    import asyncio

    release = asyncio.Event()
    calls: list[int] = []

    async def generate(request: web.Request) -> web.Response:
        calls.append(1)
        await release.wait()  # a stuck scheduler: the request is taken, nothing comes back
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/generate", generate)
    async with serving(app) as url:
        client = SGLangClient(url, retry=RetryPolicy(attempts=3, backoff_s=0.01, read_timeout_s=0.3))
        try:
            with pytest.raises(SGLangError, match="no answer within") as info:
                await asyncio.wait_for(client.generate([1], {}), timeout=10)
        finally:
            release.set()
    assert url in str(info.value) and calls == [1], "a stuck engine is not asked again"


async def test_a_health_probe_is_one_try_whatever_the_patience():
    probes: list[int] = []

    async def health(request: web.Request) -> web.Response:
        probes.append(1)
        return web.Response(status=503, text="restarting")

    app = web.Application()
    app.router.add_get("/health", health)
    async with serving(app) as url:
        assert not await SGLangClient(url, retry=RetryPolicy(attempts=60, backoff_s=1.0)).healthy()
    assert probes == [1]


def test_bad_patience_settings_are_refused():
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="read_timeout_s must be positive"):
        RetryPolicy(read_timeout_s=0)


async def test_a_give_up_says_how_many_tries_it_made():
    seen: list[dict] = []
    async with serving(_app([503] * 5, seen)) as url:
        with pytest.raises(SGLangError, match=r"gave up after 3 tries") as info:
            await SGLangClient(url, retry=FAST).generate([1], {})
    assert f"{url}/generate" in str(info.value)
