"""Closing an aiohttp session from a loop other than the one that made it."""

from __future__ import annotations

import asyncio

import aiohttp

from aclarena_slime.http_client import close_session
from aclarena_slime.testing.loops import background_loop, closed_soon


async def _make_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession()


def test_a_session_is_closed_on_its_own_live_loop_or_here_when_that_loop_is_gone():
    with background_loop() as background:
        live = asyncio.run_coroutine_threadsafe(_make_session(), background).result(10)
        asyncio.run(close_session(live, background))  # handed to the loop that owns it
        assert closed_soon(live)
    loop = asyncio.new_event_loop()
    orphan = loop.run_until_complete(_make_session())
    loop.close()
    asyncio.run(close_session(orphan, loop))  # its loop is closed: marked closed here
    assert orphan.closed
    asyncio.run(close_session(orphan, None))  # closing twice is harmless
