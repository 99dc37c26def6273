"""The capped body read both HTTP clients (the retriever's and the user simulator's) share."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from aclarena_slime.http_service import read_capped, serving


class Refused(Exception):
    pass


def _app(body: bytes, chunked: bool) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        if not chunked:
            return web.Response(body=body)
        resp = web.StreamResponse()  # no Content-Length: the cap must hold while reading
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(body), 1000):
            await resp.write(body[i : i + 1000])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", handler)
    return app


@pytest.mark.parametrize("chunked, says", [(False, "5000 bytes, more than 4096 bytes"), (True, "more than 4096 bytes")])
async def test_a_body_past_the_cap_raises_the_callers_error_naming_the_cap(chunked, says):
    async with serving(_app(b"x" * 5000, chunked)) as url, aiohttp.ClientSession() as session:
        async with session.get(url) as resp:
            with pytest.raises(Refused, match=f"^service sent {says} \\(the_cap\\)$"):
                await read_capped(resp, 4096, lambda what: Refused(f"service sent {what} (the_cap)"))


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_within_the_cap_is_read_whole(chunked):
    body = bytes(range(256)) * 16  # 4096 bytes: exactly the cap
    async with serving(_app(body, chunked)) as url, aiohttp.ClientSession() as session:
        async with session.get(url) as resp:
            assert await read_capped(resp, 4096, Refused) == body
