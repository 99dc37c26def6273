"""Running our aiohttp services (fake and local engines, retriever, router) the same way everywhere, and
reading a service's reply no larger than a cap.

Loopback by default: a service is reachable from elsewhere only when the user names another host.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # aiohttp is imported by the functions that serve: the CLI reads LOOPBACK without it
    import aiohttp
    from aiohttp import web

LOOPBACK = "127.0.0.1"


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str = LOOPBACK, port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` on the running loop for the duration of the block; yields its base URL.

    ``port=0`` picks a free port, bound before the URL is handed out (no race with other tests).
    """
    from aiohttp import web

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    bound_port = sock.getsockname()[1]
    try:
        yield f"http://{host if ':' not in host else f'[{host}]'}:{bound_port}"
    finally:
        await runner.cleanup()


def run_forever(app: web.Application, host: str = LOOPBACK, port: int = 8000) -> None:
    """Blocking entry point for the CLI's ``serve-*`` commands (Ctrl-C stops it)."""
    from aiohttp import web

    web.run_app(app, host=host, port=port, access_log=None, print=None)


async def read_capped(resp: aiohttp.ClientResponse, max_bytes: int, error: Callable[[str], Exception]) -> bytes:
    """``resp``'s body, refused once it passes ``max_bytes``: a misbehaving service cannot fill our memory.

    The refusal is ``error(what)``, the caller's own error type, where ``what`` reads "N bytes, more than CAP
    bytes" (a declared length) or "more than CAP bytes" (a body that grows past the cap while read).
    """
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise error(f"{resp.content_length} bytes, more than {max_bytes} bytes")
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > max_bytes:
            raise error(f"more than {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
