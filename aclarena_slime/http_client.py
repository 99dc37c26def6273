"""aiohttp client sessions outlive nothing gracefully: closing one made on another event loop.

Environments are shared per process and may outlive the event loop that made their HTTP session
(a test per loop, a CLI run per ``asyncio.run``); replacing or closing such a session goes through here.
"""

from __future__ import annotations

import asyncio

import aiohttp


async def close_session(session: aiohttp.ClientSession, loop: asyncio.AbstractEventLoop | None) -> None:
    """Close a session made on ``loop``: on that loop while it lives (a session is bound to its loop
    and not thread-safe), else here (aiohttp then only marks it closed)."""
    if session.closed:
        return
    if loop is None or loop.is_closed() or loop is asyncio.get_running_loop():
        await session.close()
    else:
        asyncio.run_coroutine_threadsafe(session.close(), loop)
