"""Checking a math answer against the gold one without ever hanging the caller.

Plain answers (integers — every AIME answer —, fractions, decimals, square roots, tuples and
intervals of them) are decided exactly on the spot (``exact.py``). Anything else goes to
``math-verify`` in a worker process, and its verdicts are remembered (RL samples many answers per
prompt, and they repeat): its own timeouts rely on ``signal.alarm``, which only works in a main thread, and
some expressions (``9^{9^{9^{9}}}``) stall inside sympy where no signal reaches. So each check has a
hard deadline; a worker that misses it is killed and replaced, and the answer counts as wrong.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection

from aclarena_envs.math.exact import decide

TIMED_OUT = "timed out"


@dataclass(frozen=True)
class Verdict:
    correct: bool
    method: str  # "integer" | "exact" | "math_verify" | "deepscaler" | "timeout" | "error"
    detail: str = ""


def _worker_main(conn: Connection, soft_timeout_s: int) -> None:
    from math_verify import parse, verify

    from aclarena_envs.math import deepscaler

    conn.send("ready")
    while True:
        try:
            gold, pred, grader = conn.recv()
        except EOFError:
            return
        start = time.monotonic()
        try:
            if grader == "deepscaler":
                conn.send((deepscaler.grade_blocking(pred, gold), ""))
                continue
            gold_parsed = parse(f"${gold}$", parsing_timeout=soft_timeout_s)
            pred_parsed = parse(f"\\boxed{{{pred}}}", parsing_timeout=soft_timeout_s)
            ok = bool(gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed, timeout_seconds=soft_timeout_s))
            # math-verify answers False when its own (signal) timeout fires: say so
            conn.send((ok, TIMED_OUT if not ok and time.monotonic() - start >= soft_timeout_s else ""))
        except Exception as exc:  # noqa: BLE001 - any parser failure is a wrong answer, reported
            conn.send((False, f"{type(exc).__name__}: {exc}"))


class _Worker:
    def __init__(self, soft_timeout_s: int) -> None:
        ctx = mp.get_context("spawn")  # the caller has threads (event loop, HTTP): never fork it
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, soft_timeout_s), daemon=True)
        self.process.start()
        child.close()
        self.ready = False

    def wait_ready(self, startup_timeout_s: float) -> bool:
        """Importing sympy takes a second or more: that is not the check's time."""
        if not self.ready and self.conn.poll(startup_timeout_s):
            self.ready = self.conn.recv() == "ready"
        return self.ready

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class VerifierPool:
    """``workers`` long-lived verifier processes, each check bounded by ``timeout_s`` wall time.

    The first check waits for the workers to import sympy (about a second); the pool restarts a
    worker after a timeout, which costs the same once.
    """

    def __init__(self, workers: int = 2, timeout_s: float = 5.0, cache_size: int = 65536) -> None:
        if workers < 1:
            raise ValueError("a verifier pool needs at least one worker")
        self._cache: OrderedDict[tuple[str, str, str], Verdict] = OrderedDict()  # graders' verdicts only
        self._cache_size = cache_size
        self.timeout_s = timeout_s
        self._soft_timeout = max(1, int(timeout_s) - 1)
        self._size = workers
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._started = False
        self._threads: ThreadPoolExecutor | None = None

    def _start(self) -> None:
        with self._lock:
            if not self._started:
                for _ in range(self._size):
                    self._idle.put(_Worker(self._soft_timeout))
                self._started = True

    def _executor(self) -> ThreadPoolExecutor:
        """Made on first use and again after :meth:`close`: the registry shares one env (and pool) per
        process, and ``aclose`` on it must not leave the next caller with a shut-down executor."""
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=self._size, thread_name_prefix="math-verify")
            return self._threads

    def check_blocking(
        self, gold: str, pred: str, startup_timeout_s: float = 120.0, grader: str = "math_verify"
    ) -> Verdict:
        """One check by ``grader``: ``math_verify``, or ``deepscaler`` (the authors' rule, deepscaler.py)."""
        self._start()
        worker = self._idle.get()
        try:
            if not worker.wait_ready(startup_timeout_s):
                raise OSError(f"verifier process did not start within {startup_timeout_s:g}s")
            worker.conn.send((gold, pred, grader))
            if not worker.conn.poll(self.timeout_s):
                worker.kill()
                worker = _Worker(self._soft_timeout)
                return Verdict(False, "timeout", f"no verdict within {self.timeout_s:g}s")
            ok, error = worker.conn.recv()
            if error == TIMED_OUT:
                return Verdict(False, "timeout", f"math-verify gave up after {self._soft_timeout}s")
            return Verdict(ok, "error" if error else grader, error)
        except (EOFError, OSError, BrokenPipeError) as exc:
            worker.kill()
            worker = _Worker(self._soft_timeout)
            return Verdict(False, "error", f"verifier process died: {exc!r}")
        finally:
            self._idle.put(worker)

    async def check(self, gold: str, pred: str, grader: str = "math_verify") -> Verdict:
        """Never blocks the event loop: the wait happens on one of the pool's threads. A timeout or a
        dead worker is not remembered (it may be the machine's load, not the answer)."""
        key = (gold, pred, grader)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        loop = asyncio.get_running_loop()
        verdict = await loop.run_in_executor(self._executor(), self.check_blocking, gold, pred, 120.0, grader)
        if verdict.method == grader and self._cache_size > 0:
            self._cache[key] = verdict
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return verdict

    def close(self) -> None:
        """Stop the workers and threads; the next check starts them again."""
        with self._lock:
            while not self._idle.empty():
                self._idle.get_nowait().kill()
            self._started = False
            threads, self._threads = self._threads, None
        if threads is not None:
            threads.shutdown(wait=False)


async def verify_answer(gold: str, pred: str, pool: VerifierPool) -> Verdict:
    """The exact comparison first, then ``math-verify`` in the pool for what it leaves undecided."""
    decided = decide(gold, pred)
    if decided is not None:
        return Verdict(*decided)
    return await pool.check(gold, pred)
