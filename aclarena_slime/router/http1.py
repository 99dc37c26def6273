"""A lean HTTP/1.1 server and client on asyncio protocols, for the gateway's proxy path; httptools parses.

Why not aiohttp here: against a zero-latency engine, aiohttp's request, response and client objects
cost the gateway several times the CPU of moving the bytes (``benchmarks/bench_router.py``; the README
gives the figures). This module does only what a JSON-in, JSON-or-event-stream-out proxy needs:
keep-alive, pipelined requests answered in order, Content-Length and chunked bodies both ways,
``Expect: 100-continue``, a request size cap, and back-pressure from a slow client to the engine.
aiohttp stays for the pool's health checks and adapter loads, where a request is rare.
"""

from __future__ import annotations

import asyncio
import collections
import http
import json
import ssl
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httptools

IDLE_UPSTREAM_S = 3.0  # SGLang closes idle keep-alive connections after 5 s (0.5.15 srt/environ.py: SGLANG_TIMEOUT_KEEP_ALIVE)
_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


class UpstreamConnectError(Exception):
    """No connection to the engine: nothing was sent, so the request may go elsewhere."""


class UpstreamError(Exception):
    """The engine had the request and failed it (reset, cut answer, broken HTTP): resending could run it twice."""


class Request:
    """One parsed request: method, path (no query), lower-cased header names, the whole body."""

    __slots__ = ("body", "headers", "keep_alive", "method", "path", "version")

    def __init__(self, method: str, path: str, headers: dict[str, str], body: bytes, keep_alive: bool, version: str):
        self.method, self.path, self.headers, self.body = method, path, headers, body
        self.keep_alive, self.version = keep_alive, version


Handler = Callable[["ServerConnection", Request], Awaitable[None]]


def _head(status: int, headers: list[tuple[str, str]]) -> bytearray:
    out = bytearray(b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown")))
    for name, value in headers:
        out += f"{name}: {value}\r\n".encode("latin-1")
    out += b"\r\n"
    return out


class ServerConnection(asyncio.Protocol):
    """One client connection. Requests are queued as they are parsed and handled one at a time, in order."""

    def __init__(self, handler: Handler, max_body: int, connections: set[ServerConnection]) -> None:
        self.handler, self.max_body, self.connections = handler, max_body, connections
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.pending: collections.deque[Request] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.last_active = 0.0
        self.on_pause: Callable[[bool], None] | None = None  # a stream's source, told when the client lags
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._refusal: bytes | None = None
        self._reading_paused = False
        self._chunked = False

    # --- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        self.last_active = asyncio.get_running_loop().time()
        self.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.connections.discard(self)
        if self.task is not None:  # the client left: stop its request (the engine sees its connection close)
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.refuse(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self.refuse(400, f"malformed HTTP request: {exc}")

    def pause_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause(True)

    def resume_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause(False)

    # --- httptools callbacks
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body, self._size = b"", {}, [], 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        length = self._headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            self.refuse(413, f"request body over {self.max_body} bytes")
        elif self._headers.get("expect", "").lower() == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._refusal is not None:
            return
        self._size += len(body)
        if self._size > self.max_body:
            self.refuse(413, f"request body over {self.max_body} bytes")
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._refusal is not None:
            return
        path = self._url.split(b"?", 1)[0].decode("latin-1")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = Request(
            self.parser.get_method().decode("latin-1"),
            path,
            self._headers,
            body,
            self.parser.should_keep_alive(),
            self.parser.get_http_version(),
        )
        self.pending.append(request)
        if len(self.pending) > 8 and self.transport is not None:  # a client pipelining far ahead waits
            self.transport.pause_reading()
            self._reading_paused = True
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._serve())

    # --- handling
    async def _serve(self) -> None:
        try:
            while self.pending and not self.closed:
                request = self.pending.popleft()
                await self.handler(self, request)
                if not request.keep_alive and self.transport is not None:
                    self.transport.close()
                    return
                if self._reading_paused and len(self.pending) <= 8 and self.transport is not None:
                    self.transport.resume_reading()
                    self._reading_paused = False
        finally:
            self.task = None
            self.on_pause = None
            self.last_active = asyncio.get_running_loop().time()
        if self._refusal is not None:
            self._send_refusal()

    def refuse(self, status: int, message: str) -> None:
        """Answer a request that cannot be read (after those before it are answered) and close the connection."""
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": status}}).encode()
        fields = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("Connection", "close")]
        self._refusal = bytes(_head(status, fields)) + body
        if self.task is None:
            self._send_refusal()

    def _send_refusal(self) -> None:
        if self.transport is not None and not self.closed and self._refusal is not None:
            self.transport.write(self._refusal)
            self.transport.close()

    def respond(
        self, request: Request, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        """A whole answer in one write."""
        if self.closed or self.transport is None:
            return
        fields = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        if headers:
            fields.extend(headers.items())
        if not request.keep_alive:
            fields.append(("Connection", "close"))
        head = _head(status, fields)
        if request.method != "HEAD":
            head += body
        self.transport.write(head)

    def start_stream(self, request: Request, status: int, headers: dict[str, str]) -> None:
        """Headers of an answer whose body follows in pieces (chunked; HTTP/1.0 clients: until close)."""
        assert self.transport is not None
        self._chunked = request.version != "1.0"
        fields = list(headers.items())
        if self._chunked:
            fields.append(("Transfer-Encoding", "chunked"))
        else:
            request.keep_alive = False
        if not request.keep_alive:
            fields.append(("Connection", "close"))
        self.transport.write(_head(status, fields))

    def write_piece(self, data: bytes) -> None:
        if self.closed or self.transport is None or not data:
            return
        self.transport.write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)

    def end_stream(self) -> None:
        if not self.closed and self.transport is not None and self._chunked:
            self.transport.write(b"0\r\n\r\n")

    def abort(self) -> None:
        """Cut the connection: after the headers are out, the only way to tell the client the answer broke."""
        if self.transport is not None:
            self.transport.abort()


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to an engine, one request at a time; the answer's body is collected, or
    handed piece by piece to ``sink`` once the caller sets one (streams)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.status = 0
        self.content_type = ""
        self.body: list[bytes] = []
        self.sink: Callable[[bytes], None] | None = None
        self.keep_alive = False
        self._head: asyncio.Future[None] | None = None
        self._done: asyncio.Future[None] | None = None
        self._length_known = False
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._done is not None and not self._done.done():
            if self._head is not None and self._head.done() and not self._length_known:
                self._done.set_result(None)  # an answer delimited by the connection's end
            else:
                self._fail(UpstreamError(f"connection lost{f': {exc}' if exc else ''}"))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed HTTP answer: {exc}"))
            self.close()

    def _fail(self, exc: Exception) -> None:
        for future in (self._head, self._done):
            if future is not None and not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: a failed stream's head future may never be awaited

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.lower()
        if key == b"content-type":
            self.content_type = value.decode("latin-1")
        elif key == b"content-length" or (key == b"transfer-encoding" and b"chunked" in value.lower()):
            self._length_known = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self._head is not None and not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink(body)
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def send(self, data: bytes) -> None:
        """Send a whole request; returns once the answer's status and headers are in."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.status, self.content_type, self.body, self.sink, self._length_known = 0, "", [], None, False
        self._head, self._done = loop.create_future(), loop.create_future()
        if self._paused:  # the last stream's client lagged as it ended
            self.pause(False)
        self.transport.write(data)
        await self._head

    async def finished(self) -> None:
        assert self._done is not None
        await self._done

    def take_body(self) -> bytes:
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        return body

    def pause(self, paused: bool) -> None:
        """Stop (or resume) reading the engine's answer while the client cannot take more."""
        if self.transport is not None and not self.closed and paused != self._paused:
            self._paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamPool:
    """Keep-alive connections to one engine (``http://host:port[/prefix]``), reused most recent first."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine URL {url!r} is not http(s)://host[:port]")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc.rsplit("@", 1)[-1]
        self.idle: list[UpstreamConnection] = []
        self._heads: dict[str, bytes] = {}

    def head(self, path: str, length: int) -> bytes:
        """The request line and headers of a JSON POST to ``path`` (cached but for the length)."""
        fixed = self._heads.get(path)
        if fixed is None:
            fixed = self._heads[path] = (
                f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
                "Content-Type: application/json\r\nContent-Length: "
            ).encode("latin-1")
        return fixed + b"%d\r\n\r\n" % length

    async def acquire(self) -> UpstreamConnection:
        now = asyncio.get_running_loop().time()
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_UPSTREAM_S:
                return conn
            conn.close()
        try:
            _, conn = await asyncio.get_running_loop().create_connection(
                UpstreamConnection, self.host, self.port, ssl=self.ssl
            )
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return conn

    def release(self, conn: UpstreamConnection, reusable: bool) -> None:
        """Back to the pool after a complete answer on a keep-alive connection; otherwise closed."""
        if reusable and conn.keep_alive and not conn.closed:
            conn.idle_since = asyncio.get_running_loop().time()
            self.idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
