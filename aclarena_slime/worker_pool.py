"""A pool of fresh worker interpreters that do not outlive the process that started them.

The benchmarks run seeds side by side, each in its own spawned interpreter (no forked torch state, one torch
thread each, its CPU seconds its own). A spawned worker is its own process: when the benchmark is stopped
(Ctrl-C twice, ``kill``), a worker running a stage would go on computing for minutes, unseen, and slow
whatever is measured next. Each worker here watches its parent and exits once the parent is gone.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor

PARENT_CHECK_S = 1.0  # how often a worker checks that its parent is still there


def worker_pool(jobs: int, max_tasks_per_child: int | None = None) -> ProcessPoolExecutor:
    """``jobs`` spawned workers that exit when this process does (``max_tasks_per_child``: as the executor's)."""
    return ProcessPoolExecutor(
        jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=exit_with_parent,
        initargs=(os.getpid(),),
        max_tasks_per_child=max_tasks_per_child,
    )


def exit_with_parent(parent: int) -> None:
    """In a worker: end this process as soon as ``parent`` is no longer its parent (it died; init adopted us)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)  # no cleanup to wait for: the stage's outputs are written atomically or not at all

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
