"""An event loop on another thread, as slime runs its rollout functions (``slime/utils/async_utils.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator


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

