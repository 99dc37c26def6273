"""The benchmarks' worker pool: a worker does not outlive the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

PARENT = """
import os, sys, time
from aclarena_slime.worker_pool import worker_pool

if __name__ == "__main__":
    pool = worker_pool(1)
    print(pool.submit(os.getpid).result(), flush=True)  # the worker's pid
    pool.submit(time.sleep, 120)
    time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (exited, not yet reaped by init) is gone too
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_worker_exits_when_its_parent_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(parent.stdout.readline())
        time.sleep(1.0)
        assert alive(worker)  # busy with the 120 s task
        parent.send_signal(signal.SIGKILL)  # no cleanup in the parent: only the worker's own watch can end it
        parent.wait(timeout=10)
        deadline = time.monotonic() + 15
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(worker)
    finally:
        parent.kill()
