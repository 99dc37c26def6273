"""Event loops for tests of code that outlives one loop (shared envs, HTTP sessions)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def background_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop that keeps running on another thread for the duration of the block."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def closed_soon(session: Any, timeout_s: float = 5.0) -> bool:
    """Closing a session on another thread's loop is asynchronous: wait a little for it."""
    deadline = time.monotonic() + timeout_s
    while not session.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    return session.closed
