"""A lean HTTP/1.1 server and client on asyncio protocols, for the gateway's proxy path; httptools parses.

Why not aiohttp here: against a zero-latency engine, aiohttp's request, response and client objects
cost the gateway several times the CPU of moving the bytes (``benchmarks/bench_router.py``; the README
gives the figures). This module does only what a JSON-in, JSON-or-event-stream-out proxy needs:
keep-alive, pipelined requests answered in order, Content-Length and chunked bodies both ways,
``Expect: 100-continue``, a request size cap, back-pressure from a slow client to the engine, and the
limits that keep slow or many clients from starving the rest (:class:`ClientLimits`: header and body
read deadlines, a connection cap) and a stalled engine from holding a request forever (``send``'s timeout).
aiohttp stays for the pool's health checks and adapter loads, where a request is rare.
"""

from __future__ import annotations

import asyncio
import collections
import http
import json
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

IDLE_UPSTREAM_S = 3.0  # SGLang closes idle keep-alive connections after 5 s (0.5.15 srt/environ.py: SGLANG_TIMEOUT_KEEP_ALIVE)
_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


class UpstreamConnectError(Exception):
    """No connection to the engine: nothing was sent, so the request may go elsewhere."""


class UpstreamError(Exception):
    """The engine had the request and failed it (reset, cut answer, broken HTTP): resending could run it twice."""


class UpstreamTimeout(UpstreamError):
    """The engine had the request and sent nothing for the whole timeout: stalled (or far too slow)."""


@dataclass(frozen=True)
class ClientLimits:
    """What one client connection may hold of the gateway (the gateway's settings fill it in).

    Without these, clients that send a byte a second each hold a connection (and a file descriptor)
    for as long as they like: a few hundred of them exhaust the descriptors and every other client is
    refused while nothing is logged.
    """

    max_body: int
    header_timeout_s: float  # from a request's first byte to the end of its headers
    body_timeout_s: float  # from the end of the headers to the end of the body
    idle_timeout_s: float  # a keep-alive connection with no request for this long is closed
    max_connections: int  # at the cap, the oldest idle or still-in-headers connection makes room, else 503


class ConnectionTable:
    """The open client connections and what the limits did to them since the last :meth:`take_counts`."""

    def __init__(self, limits: ClientLimits) -> None:
        self.limits = limits
        self.open: set[ServerConnection] = set()
        self.counts: collections.Counter[str] = collections.Counter()

    def make_room(self) -> bool:
        """At the cap, close the connection that has waited longest without a request in hand; False if none."""
        if len(self.open) < self.limits.max_connections:
            return True
        candidates = [c for c in self.open if c.evictable()]
        if not candidates:
            self.counts["refused at the connection cap"] += 1
            return False
        victim = min(candidates, key=lambda c: c.waiting_since())
        self.open.discard(victim)
        if victim.transport is not None:
            victim.transport.close()
        self.counts["closed to make room at the connection cap"] += 1
        return True

    def sweep(self, now: float) -> None:
        """Answer 408 to requests read too slowly and close idle keep-alive connections."""
        limits = self.limits
        for conn in list(self.open):
            if conn.closed or conn._refusal is not None or conn._reading_paused:
                continue
            if conn.request_started is not None:
                if conn.headers_done is None and now - conn.request_started > limits.header_timeout_s:
                    self.counts["too slow sending headers"] += 1
                    conn.refuse(408, f"request headers not complete within {limits.header_timeout_s:g} s")
                elif conn.headers_done is not None and now - conn.headers_done > limits.body_timeout_s:
                    self.counts["too slow sending a body"] += 1
                    conn.refuse(408, f"request body not complete within {limits.body_timeout_s:g} s")
            elif conn.task is None and now - conn.last_active > limits.idle_timeout_s and conn.transport:
                conn.transport.close()

    def take_counts(self) -> dict[str, int]:
        counts = dict(self.counts)
        self.counts.clear()
        return counts


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

    def __init__(self, handler: Handler, table: ConnectionTable) -> None:
        self.handler, self.table, self.max_body = handler, table, table.limits.max_body
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.pending: collections.deque[Request] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.last_active = 0.0
        self.request_started: float | None = None  # when the request being read began; None between requests
        self.headers_done: float | None = None  # when its headers were complete
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
        if not self.table.make_room():
            self._refusal = b""  # nothing more is read
            message = "the gateway is at its connection cap; retry later"
            body = json.dumps({"error": {"message": message, "type": "service_unavailable", "code": 503}}).encode()
            fields = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("Connection", "close")]
            transport.write(bytes(_head(503, fields)) + body)  # type: ignore[attr-defined]
            transport.close()
            self.closed = True
            return
        self.table.open.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.table.open.discard(self)
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
        self.request_started, self.headers_done = asyncio.get_running_loop().time(), None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = asyncio.get_running_loop().time()
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
        self.request_started = self.headers_done = None
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

    def evictable(self) -> bool:
        """Holding nothing in hand: idle between requests, or still in the headers of one."""
        return (
            self.task is None
            and not self.pending
            and self._refusal is None
            and (self.request_started is None or self.headers_done is None)
        )

    def waiting_since(self) -> float:
        return self.request_started if self.request_started is not None else self.last_active

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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timeout_s = 0.0
        self._last_data = 0.0  # when the engine last sent anything for the request in flight
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport
        self._loop = asyncio.get_running_loop()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        if self._done is not None and not self._done.done():
            if self._head is not None and self._head.done() and not self._length_known:
                self._done.set_result(None)  # an answer delimited by the connection's end
            else:
                self._fail(UpstreamError(f"connection lost{f': {exc}' if exc else ''}"))

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            self._last_data = self._loop.time()  # type: ignore[union-attr]
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed HTTP answer: {exc}"))
            self.close()

    def _check_silence(self) -> None:
        """The timer: fail the request once the engine has sent nothing for the whole timeout. One timer a
        request, re-armed for what is left rather than reset on every piece; a client holding the answer
        back (reading paused) is not the engine's silence."""
        assert self._loop is not None
        self._timer = None
        if self.closed or self._done is None or self._done.done():
            return
        quiet = self._loop.time() - self._last_data
        if self._paused or quiet < self._timeout_s:
            self._timer = self._loop.call_later(self._timeout_s - (0 if self._paused else quiet), self._check_silence)
            return
        self._fail(UpstreamTimeout(f"the engine sent nothing for {self._timeout_s:g} s"))
        self.close()

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

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
        self._disarm()
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def send(self, data: bytes, timeout_s: float | None = None) -> None:
        """Send a whole request; returns once the answer's status and headers are in. ``timeout_s``: the
        longest the engine may send nothing (before the head, or between pieces of the body), after which
        the request fails with :class:`UpstreamTimeout` and the connection is closed."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.status, self.content_type, self.body, self.sink, self._length_known = 0, "", [], None, False
        self._head, self._done = loop.create_future(), loop.create_future()
        if self._paused:  # the last stream's client lagged as it ended
            self.pause(False)
        self._disarm()
        if timeout_s is not None:
            self._timeout_s, self._last_data = timeout_s, loop.time()
            self._timer = loop.call_later(timeout_s, self._check_silence)
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
                self._last_data = self._loop.time() if self._loop is not None else 0.0  # silence counts from now
                self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        self._disarm()
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
