"""The gateway's own HTTP/1.1 (aclarena_slime.router.http1) as clients and engines exercise it: raw sockets
for what aiohttp's client never sends (pipelining, HTTP/1.0, Expect, chunked bodies, broken requests)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import pytest
from aiohttp import web

from aclarena_slime.router import gateway as gateway_module
from aclarena_slime.router import http1
from aclarena_slime.testing.fake_sglang import FakeSGLang

from .conftest import client, gateway, post

BODY = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}}).encode()


def _post(path: str, body: bytes, *extra: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "Host: gw", "X-Aclarena-Env: math", *extra]
    if not any(h.lower().startswith(("transfer-encoding", "content-length")) for h in extra):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response off a raw connection (Content-Length, chunked, or until the connection closes)."""
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int((await reader.readline()).strip(), 16):
            body += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
        return status, headers, body
    return status, headers, await reader.read()


async def _raw(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.split("//")[1].rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def test_pipelined_requests_are_answered_in_order(tiny_tokenizer, manifest):
    replies = iter(["first", "second", "third"])
    async with FakeSGLang(tiny_tokenizer, lambda _: next(replies)) as a, gateway([a.url], manifest) as (url, _):
        reader, writer = await _raw(url)
        writer.write(_post("/generate", BODY) + b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n" + _post("/generate", BODY))
        answers = [await _answer(reader) for _ in range(3)]
        writer.close()
    assert [status for status, _, _ in answers] == [200, 200, 200]
    assert json.loads(answers[0][2])["text"] == "first" and json.loads(answers[2][2])["text"] == "second"
    assert json.loads(answers[1][2])["healthy"] == 1


async def test_expect_continue_chunked_body_and_http_1_0(tiny_tokenizer, manifest):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest) as (url, _):
        reader, writer = await _raw(url)
        writer.write(_post("/generate", b"", "Expect: 100-continue", f"Content-Length: {len(BODY)}"))
        assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n" and await reader.readline() == b"\r\n"
        writer.write(BODY)
        status, _, body = await _answer(reader)
        assert status == 200 and json.loads(body)["text"] == "ok"
        chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (5, BODY[:5], len(BODY) - 5, BODY[5:])
        writer.write(_post("/generate", b"", "Transfer-Encoding: chunked") + chunked)
        status, _, body = await _answer(reader)
        assert status == 200 and json.loads(body)["text"] == "ok"
        writer.close()
        assert a.requests[-1]["input_ids"] == [1, 2, 3] and a.requests[-1]["lora_path"] == "math-expert"

        for stream in (False, True):  # an HTTP/1.0 client: no chunked framing, the end is the connection's end
            reader, writer = await _raw(url)
            writer.write(_post("/generate", json.dumps({**json.loads(BODY), "stream": stream}).encode(), version="1.0"))
            status, headers, body = await _answer(reader)
            assert status == 200 and headers["connection"] == "close" and "transfer-encoding" not in headers
            assert (b"data: [DONE]" in body) if stream else json.loads(body)["text"] == "ok"
            assert await reader.read() == b"" and reader.at_eof()
            writer.close()


async def test_bad_requests_get_clear_errors(tiny_tokenizer, manifest):
    settings = gateway_module.GatewaySettings(max_body_bytes=1000)
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest, settings=settings) as (url, _):
        async with client() as http:
            for method, path, status in [("GET", "/generate", 405), ("POST", "/nope", 404), ("POST", "/health", 405)]:
                async with http.request(method, f"{url}{path}", data=BODY) as resp:
                    assert resp.status == status and path in (await resp.json())["error"]["message"]
            status, out = await post(http, f"{url}/generate", {"text": "x" * 2000}, **{"X-Aclarena-Env": "math"})
            assert status == 413 and "over 1000 bytes" in out["error"]["message"]
            async with http.head(f"{url}/health") as resp:
                assert resp.status == 200 and await resp.read() == b""
        reader, writer = await _raw(url)
        writer.write(_post("/generate", b"", "Content-Length: 99999999999"))  # refused before any body is sent
        status, headers, body = await _answer(reader)
        assert status == 413 and headers["connection"] == "close" and await reader.read() == b""
        writer.close()
        reader, writer = await _raw(url)
        writer.write(b"POST /generate HTTP/1.1\r\nContent-Length: x\r\n\r\n")
        status, _, body = await _answer(reader)
        assert status == 400 and "malformed HTTP request" in json.loads(body)["error"]["message"]
        assert await reader.read() == b""
        writer.close()
        async with client() as http:  # and the gateway goes on serving
            status, out = await post(http, f"{url}/generate", json.loads(BODY), **{"X-Aclarena-Env": "math"})
            assert status == 200
    assert len(a.requests) == 1, "nothing refused reached the engine"


class _Peers(FakeSGLang):
    """Records the client port of each generation request, and whether the client left before the answer."""

    def __init__(self, *args, delay_s: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.peers: list[int] = []
        self.delay_s = delay_s
        self.left: list[bool] = []

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.peers.append(request.transport.get_extra_info("peername")[1])
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
            self.left.append(request.transport is None or request.transport.is_closing())
        return await super()._generate(request)


async def test_engine_connections_are_kept_alive_and_renewed_when_idle(tiny_tokenizer, manifest, monkeypatch):
    async with _Peers(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest) as (url, pool), client() as http:
        for _ in range(5):
            status, _ = await post(http, f"{url}/generate", json.loads(BODY), **{"X-Aclarena-Env": "math"})
            assert status == 200
        assert len(set(a.peers)) == 1, "one keep-alive connection served them all"
        monkeypatch.setattr(http1, "IDLE_UPSTREAM_S", 0.0)  # past the engine's keep-alive: never reused
        for _ in range(2):
            status, _ = await post(http, f"{url}/generate", json.loads(BODY), **{"X-Aclarena-Env": "math"})
        assert len(set(a.peers)) == 3
        assert len(pool.engines[0].connections.idle) == 1


async def test_a_client_that_leaves_closes_its_engine_request(tiny_tokenizer, manifest):
    async with _Peers(tiny_tokenizer, ["ok"], delay_s=0.5) as a, gateway([a.url], manifest) as (url, pool):
        reader, writer = await _raw(url)
        writer.write(_post("/generate", BODY))
        while not a.peers:
            await asyncio.sleep(0.01)
        writer.close()  # gone while the engine generates
        while not a.left:
            await asyncio.sleep(0.01)
        assert a.left == [True], "the engine saw its request's connection close"
        assert pool.engines[0].in_flight == 0 and pool.engines[0].connections.idle == []
        async with client() as http:
            status, out = await post(http, f"{url}/generate", json.loads(BODY), **{"X-Aclarena-Env": "math"})
        assert status == 200 and out["text"] == "ok" and pool.engines[0].healthy


def test_runs_on_uvloop_when_installed_and_on_asyncio_without(monkeypatch):
    async def loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert gateway_module.run(loop_module()).startswith("uvloop" if _has_uvloop() else "asyncio")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # an interpreter without it
    assert gateway_module.run(loop_module()).startswith("asyncio")


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("url", ["127.0.0.1:30000", "ftp://h:1"])
def test_engine_urls_must_be_http(url):
    with pytest.raises(ValueError, match="is not http"):
        http1.UpstreamPool(url)


class _Flood(FakeSGLang):
    """Streams 8 MB, more than the kernel's socket buffers take: 1,000 events of 8 kB."""

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(1000):
            await response.write(b"data: %04d%s\n\n" % (i, b"x" * 8192))
        await response.write_eof()
        return response


async def test_a_client_that_does_not_read_holds_the_engine_back(tiny_tokenizer, manifest, monkeypatch):
    pauses: list[bool] = []
    original = http1.UpstreamConnection.pause

    def pause(self, paused: bool) -> None:
        pauses.append(paused)
        original(self, paused)

    monkeypatch.setattr(http1.UpstreamConnection, "pause", pause)
    async with _Flood(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest, health_interval_s=3600) as (url, _):
        host, port = url.split("//")[1].rsplit(":", 1)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # a small window: the gateway's buffer fills
        sock.connect((host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(_post("/generate", BODY))
        deadline = asyncio.get_running_loop().time() + 30
        while True not in pauses:  # not reading: the gateway's buffer fills and it stops reading the engine
            assert asyncio.get_running_loop().time() < deadline, "the gateway never held the engine back"
            await asyncio.sleep(0.05)
        status, _, body = await _answer(reader)
        assert status == 200 and body.count(b"data: ") == 1000 and body.endswith(b"data: 0999" + b"x" * 8192 + b"\n\n")
        assert pauses[-1] is False or len(pauses) % 2 == 1  # resumed as the client read, or at the next request
        writer.write(_post("/generate", BODY))  # the same engine connection serves the next one
        status, _, body = await _answer(reader)
        assert status == 200 and body.count(b"data: ") == 1000
        writer.close()


class _Slow(FakeSGLang):
    """Streams three events a moment apart."""

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return await super()._generate(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(b"data: %d\n\n" % i)
            await asyncio.sleep(0.1)
        await response.write_eof()
        return response


async def test_a_request_sent_during_a_stream_waits_for_it(tiny_tokenizer, manifest):
    async with _Slow(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest) as (url, _):
        reader, writer = await _raw(url)
        writer.write(_post("/generate", json.dumps({**json.loads(BODY), "stream": True}).encode()))
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        writer.write(_post("/generate", BODY))  # while the stream is still coming
        headers = {}
        while (line := await reader.readline()) != b"\r\n":
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        assert headers["transfer-encoding"] == "chunked"
        events = b""
        while size := int((await reader.readline()).strip(), 16):
            events += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
        assert events == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        status, _, body = await _answer(reader)
        assert status == 200 and json.loads(body)["text"] == "ok"
        writer.close()
