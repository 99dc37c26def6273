"""The gateway's limits (issue 44 §5): slow and many clients, a stalled engine, hostile JSON, and SGLang's own
words for an adapter it lacks. Loopback only, a few connections, deadlines of a fraction of a second."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web

from aclarena_slime.router.gateway import GatewaySettings
from aclarena_slime.testing.fake_sglang import FakeSGLang

from .conftest import client, gateway, post
from .test_http1 import BODY, _answer, _post, _raw

MATH = {"X-Aclarena-Env": "math"}


async def _bounded(coro, seconds: float = 5.0):
    """A hang is a failure, not a stuck test run."""
    return await asyncio.wait_for(coro, seconds)


async def test_a_client_trickling_its_request_gets_a_408_and_is_closed(tiny_tokenizer, manifest, caplog):
    settings = GatewaySettings(header_timeout_s=0.3, body_timeout_s=0.3)
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest, settings=settings) as (url, _):
        slow_head = await _raw(url)
        slow_head[1].write(b"POST /generate HTTP/1.1\r\nHo")  # and never the rest of the headers
        slow_body = await _raw(url)
        slow_body[1].write(_post("/generate", BODY)[:-5])  # headers whole, the body five bytes short
        with caplog.at_level(logging.WARNING, logger="aclarena_slime.router.gateway"):
            for (reader, writer), what in [(slow_head, "headers"), (slow_body, "body")]:
                status, headers, body = await _bounded(_answer(reader))
                assert status == 408 and headers["connection"] == "close"
                assert f"request {what} not complete within 0.3 s" in json.loads(body)["error"]["message"]
                assert await _bounded(reader.read()) == b""
                writer.close()
            await asyncio.sleep(0.2)  # the next sweep logs what the limits did
        assert "too slow sending headers: 1" in caplog.text and "too slow sending a body: 1" in caplog.text
        async with client() as http:  # a prompt client on its own keep-alive connection is served as ever
            assert (await post(http, f"{url}/generate", json.loads(BODY), **MATH))[0] == 200
    assert a.requests and all(r["input_ids"] == [1, 2, 3] for r in a.requests)


async def test_many_slow_clients_at_the_connection_cap_do_not_starve_the_others(tiny_tokenizer, manifest, caplog):
    # 20 clients stuck in their headers against a cap of 10 and a header deadline far off: the legitimate
    # requests still get through (the longest-waiting slow connection makes room), and it is logged.
    settings = GatewaySettings(max_connections=10, header_timeout_s=2.0)
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest, settings=settings) as (url, _):
        slow = []
        for _ in range(20):
            reader, writer = await _raw(url)
            writer.write(b"POST /generate HTTP/1.1\r\nX-Slow: ")
            slow.append((reader, writer))
            await asyncio.sleep(0.005)
        with caplog.at_level(logging.WARNING, logger="aclarena_slime.router.gateway"):
            async with client() as http:
                answers = await _bounded(
                    asyncio.gather(*(post(http, f"{url}/generate", json.loads(BODY), **MATH) for _ in range(5)))
                )
            assert [status for status, _ in answers] == [200] * 5
            await asyncio.sleep(0.6)  # the sweep (every header_timeout / 4) logs what the cap did
        closed = [reader.at_eof() or reader.exception() is not None for reader, _ in slow]
        assert sum(closed) >= 10 and closed[0], "the longest-waiting slow connections made room"
        for _, writer in slow:
            writer.close()
        assert "closed to make room at the connection cap" in caplog.text and "cap 10" in caplog.text


async def test_at_the_cap_with_every_connection_busy_a_new_one_gets_a_503(tiny_tokenizer, manifest):
    settings = GatewaySettings(max_connections=2, body_timeout_s=30.0)
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest, settings=settings) as (url, _):
        busy = [await _raw(url) for _ in range(2)]
        for _, writer in busy:  # headers whole, body pending: holding a request, not evictable
            writer.write(_post("/generate", BODY)[:-1])
        await asyncio.sleep(0.05)
        reader, writer = await _raw(url)
        status, headers, body = await _bounded(_answer(reader))
        assert status == 503 and "connection cap" in json.loads(body)["error"]["message"]
        writer.close()
        for reader, writer in busy:  # the busy ones finish their requests and are answered
            writer.write(BODY[-1:])
            assert (await _bounded(_answer(reader)))[0] == 200
            writer.close()


def test_the_connection_cap_fits_the_descriptor_limit(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 4096))
    assert GatewaySettings(max_connections=4096).client_limits().max_connections == (256 - 64) // 2
    assert GatewaySettings(max_connections=20).client_limits().max_connections == 20
    with pytest.raises(ValueError, match="header_timeout_s"):
        GatewaySettings(header_timeout_s=0)


class _Stalls(FakeSGLang):
    """Healthy to /health (as SGLang is while it runs requests), but /generate never answers once stalled."""

    stalled = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.release = asyncio.Event()  # set on the way out, so the server's shutdown does not wait on it

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        await super().__aexit__(*exc)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        if not self.stalled:
            return await super()._generate(request)
        if (await request.json()).get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"text": "half"}\n\n')
        await self.release.wait()
        return web.Response(status=500)


async def test_an_engine_whose_generate_stalls_times_out_and_is_held_out(tiny_tokenizer, manifest):
    settings = GatewaySettings(upstream_timeout_s=0.3, stalled_hold_s=30.0)
    async with _Stalls(tiny_tokenizer, ["ok"]) as a, FakeSGLang(tiny_tokenizer, ["ok"]) as b:
        async with gateway([a.url, b.url], manifest, settings=settings) as (url, pool), client() as http:
            a.stalled = True
            answers = await _bounded(asyncio.gather(*(post(http, f"{url}/generate", json.loads(BODY), **MATH)
                                                      for _ in range(2))))
            timed_out = [out for status, out in answers if status == 504]
            assert len(timed_out) == 1 and a.url in timed_out[0]["error"]["message"]
            assert "sent nothing for 0.3 s" in timed_out[0]["error"]["message"]
            assert not pool.engines[0].healthy and "timed out" in pool.engines[0].reason
            await pool.check_all()  # /health answers 200, but the engine stays out while held
            assert not pool.engines[0].healthy
            for _ in range(4):
                assert (await _bounded(post(http, f"{url}/generate", json.loads(BODY), **MATH)))[0] == 200
            assert len(b.requests) == 5
            pool.engines[0].held_until = 0.0  # the hold over: back at the next good health check
            a.stalled = False
            await pool.check_all()
            assert pool.engines[0].healthy


async def test_a_stream_that_stalls_is_cut_and_its_engine_held_out(tiny_tokenizer, manifest):
    settings = GatewaySettings(upstream_timeout_s=0.3, stalled_hold_s=30.0)
    async with _Stalls(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest, settings=settings) as (url, pool):
        a.stalled = True
        reader, writer = await _raw(url)
        writer.write(_post("/generate", json.dumps({**json.loads(BODY), "stream": True}).encode()))
        assert (await _bounded(reader.readline())).startswith(b"HTTP/1.1 200")
        assert b'"half"' in await _bounded(reader.read())  # then the cut
        writer.close()
        assert not pool.engines[0].healthy and "held out for 30 s" in pool.engines[0].reason


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model": "qwen3-8b-sdft:math", "messages": [], "max_tokens": ' + b"9" * 5000 + b"}",
    ],
    ids=["100k-deep", "5000-digit-int"],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/generate"])
async def test_hostile_json_is_a_400_not_a_500(tiny_tokenizer, manifest, caplog, body, path):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest) as (url, _), client() as http:
        with caplog.at_level(logging.ERROR, logger="aclarena_slime.router.gateway"):
            async with http.post(f"{url}{path}", data=body, headers={"Content-Type": "application/json"}) as resp:
                status, out = resp.status, await resp.json()
        assert status == 400 and "request body is not valid JSON" in out["error"]["message"]
        assert "gateway failed" not in caplog.text, "no traceback per request"
    assert a.requests == []


# SGLang 0.5.15 srt/managers/tokenizer_manager.py (_resolve_lora_path) raises these ValueErrors, and
# srt/entrypoints/http_server.py answers a ValueError of /generate with {"error": {"message": ...}}, 400.
_SGLANG_LOST = {
    "restarted": "Got LoRA adapter that has never been loaded: {name}\nAll loaded adapters: dict_keys([]).",
    "folder-gone": "Failed to implicitly load LoRA adapter {name}: Failed to load LoRA adapter {name}: "
    "[Errno 2] No such file or directory",
}


@pytest.mark.parametrize("case", sorted(_SGLANG_LOST))
async def test_sglang_words_for_a_lost_adapter_make_the_gateway_reload_it(tiny_tokenizer, manifest, case):
    class Forgets(FakeSGLang):
        async def _generate(self, request: web.Request) -> web.StreamResponse:
            lora = (await request.json()).get("lora_path")
            if lora is not None and lora not in self.adapters:
                message = _SGLANG_LOST[case].format(name=lora)
                return web.json_response({"error": {"message": message}}, status=400)
            return await super()._generate(request)

    async with Forgets(tiny_tokenizer, ["ok"]) as a:
        async with gateway([a.url], manifest, health_interval_s=3600) as (url, _), client() as http:
            del a.adapters["math-expert"]
            status, out = await post(http, f"{url}/generate", json.loads(BODY), **MATH)
            assert status == 200 and out["text"] == "ok"
            assert "math-expert" in a.adapters and a.requests[-1]["lora_path"] == "math-expert"


def test_serve_router_refuses_a_limit_out_of_range(manifest, capsys):
    from aclarena_slime.cli import main as cli_main

    argv = ["serve-router", "--engine", "http://127.0.0.1:1", "--experts", str(manifest), "--upstream-timeout", "0"]
    assert cli_main(argv) == 2
    assert "upstream_timeout_s must be > 0" in capsys.readouterr().err
