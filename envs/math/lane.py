"""Short synchronous jobs on the event loop, run in slices so that a gathered batch cannot hold it.

Grading one answer on the loop takes tens of microseconds; a rollout that scores 300 samples with
``asyncio.gather`` would run all of them back to back in one turn of the loop, and everything else
in the process (HTTP to the engine, other rollouts) would wait for the whole batch. Jobs queue here
instead, and one drain task per event loop runs them for at most ``slice_s`` before it yields a turn.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Lane:
    def __init__(self, slice_s: float = 0.0005) -> None:
        self.slice_s = slice_s
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, deque] = weakref.WeakKeyDictionary()

    async def run(self, job: Callable[[], T]) -> T:
        """``job()``'s result (or exception), run on this event loop in its turn."""
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = deque()
        future: asyncio.Future[Any] = loop.create_future()
        queue.append((job, future))
        if len(queue) == 1:  # it was empty: no drain task is running on this loop
            loop.create_task(self._drain(queue))
        return await future

    async def _drain(self, queue: deque) -> None:
        while True:
            deadline = time.perf_counter() + self.slice_s
            while True:  # at least one job a turn, then as many as fit in the slice
                job, future = queue[0]
                if not future.cancelled():
                    try:
                        future.set_result(job())
                    except Exception as exc:  # noqa: BLE001 - handed to the awaiting caller as it is
                        future.set_exception(exc)
                queue.popleft()  # only now: a job queued meanwhile must not start a second drain
                if not queue:
                    return
                if time.perf_counter() >= deadline:
                    break
            await asyncio.sleep(0)
