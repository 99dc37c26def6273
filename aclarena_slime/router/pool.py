"""The SGLang engines behind the gateway: health, adapters loaded on each, and who serves next.

Every engine must hold every expert. The pool loads the experts at start and again whenever an engine
comes back (a restarted SGLang server has forgotten its dynamically loaded adapters). An engine is
used only while healthy and only for adapters it holds; among those, the one with the fewest requests
in flight serves, ties taken in turn. No engine left: :class:`NoEngine`, which the gateway answers
with a 503 that says why. ``/health`` can answer 200 while a request is stuck (SGLang's
``health_generate`` counts any output since the check began, and skips generating at all with
``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` off; our local and fake engines never generate for it),
so an engine whose request timed out is held out of rotation for a while whatever /health says.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from aclarena_slime.adapter_swap import AdapterSwapError, load_adapters
from aclarena_slime.experts import ExpertTable
from aclarena_slime.router.http1 import UpstreamPool
from aclarena_slime.sglang_client import RetryPolicy, SGLangClient

log = logging.getLogger(__name__)


class NoEngine(Exception):
    """No healthy engine can serve the request; the message says what each engine's state is."""


@dataclass
class Engine:
    url: str
    healthy: bool = False
    reason: str = "not checked yet"
    adapters: set[str] = field(default_factory=set)
    failed_adapters: dict[str, str] = field(default_factory=dict)
    in_flight: int = 0
    served: int = 0
    held_until: float = 0.0  # loop time before which a good health check does not bring it back (stalled)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    connections: UpstreamPool = field(init=False, repr=False)  # keep-alive connections for proxied requests

    def __post_init__(self) -> None:
        self.connections = UpstreamPool(self.url)

    def status(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "reason": self.reason,
            "adapters": sorted(self.adapters),
            "failed_adapters": dict(self.failed_adapters),
            "in_flight": self.in_flight,
            "served": self.served,
        }


class EnginePool:
    """``await pool.start()``, then ``pool.pick(needs)`` and ``with pool.lease(engine): ...``."""

    def __init__(
        self,
        urls: list[str],
        table: ExpertTable,
        *,
        health_interval_s: float = 5.0,
        health_timeout_s: float = 5.0,
        load_timeout_s: float = 120.0,
    ) -> None:
        if not urls:
            raise ValueError("the router needs at least one engine URL")
        self.engines = [Engine(url.rstrip("/")) for url in urls]  # ValueError for a URL that is not http(s)
        # experts without a path must have been given to the engine at its start (--lora-paths)
        self.loadable = {e.adapter: str(e.path) for e in table.experts.values() if e.path is not None}
        self.preloaded = {e.adapter for e in table.experts.values() if e.path is None}
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.load_timeout_s = load_timeout_s
        self.session: aiohttp.ClientSession | None = None
        self._turn = itertools.count()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the session, check every engine once (loading adapters), then keep checking."""
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            cookie_jar=aiohttp.DummyCookieJar(),  # engines set no cookies: skip the jar on every request
        )
        await self.check_all()
        self._task = asyncio.create_task(self._watch())

    async def close(self) -> None:
        for engine in self.engines:
            engine.connections.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.session is not None:
            await self.session.close()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_all()

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(engine) for engine in self.engines))

    async def check(self, engine: Engine) -> None:
        """One health check; an engine that was down (or lacks adapters) gets them (re)loaded."""
        assert self.session is not None
        try:
            timeout = aiohttp.ClientTimeout(total=self.health_timeout_s)
            async with self.session.get(f"{engine.url}/health", timeout=timeout) as resp:
                await resp.read()
                ok, why = resp.status == 200, f"/health answered {resp.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            ok, why = False, f"unreachable: {type(exc).__name__}: {exc}"
        if not ok:
            self.mark_down(engine, why)
            return
        if asyncio.get_running_loop().time() < engine.held_until:
            return  # answers /health, but its last request stalled: kept out until the hold ends
        if not engine.healthy or set(self.loadable) - engine.adapters:
            await self.ensure_adapters(engine)
        engine.healthy, engine.reason = True, "ok"

    def mark_down(self, engine: Engine, reason: str, hold_s: float = 0.0) -> None:
        """Down engines forget their adapters and connections: if they come back, it is as a restarted server.
        ``hold_s``: not back before that many seconds, however its health check answers."""
        if hold_s > 0:
            engine.held_until = asyncio.get_running_loop().time() + hold_s
            reason = f"{reason} (held out for {hold_s:g} s)"
        if engine.healthy:
            log.warning("engine %s is down: %s", engine.url, reason)
        engine.healthy, engine.reason = False, reason
        engine.adapters.clear()
        engine.connections.close()

    async def ensure_adapters(self, engine: Engine, reload: str | None = None) -> None:
        """Load every expert the engine does not hold; ``reload`` forces one adapter (it said it lacks it)."""
        assert self.session is not None
        async with engine.lock:
            if reload is not None:
                engine.adapters.discard(reload)
            for name, path in self.loadable.items():
                if name in engine.adapters:
                    continue
                error = await self._load(engine, name, path)
                if error is None:
                    engine.adapters.add(name)
                    engine.failed_adapters.pop(name, None)
                    log.info("engine %s: loaded adapter %s from %s", engine.url, name, path)
                else:
                    engine.failed_adapters[name] = error
                    log.error("engine %s: cannot load adapter %s: %s", engine.url, name, error)

    async def _load(self, engine: Engine, name: str, path: str) -> str | None:
        """Load through the one adapter mechanism (:mod:`aclarena_slime.adapter_swap`); the error, or None."""
        assert self.session is not None
        client = SGLangClient(engine.url, RetryPolicy(attempts=1, timeout_s=self.load_timeout_s), session=self.session)
        try:
            await load_adapters([client], {name: path})  # an engine still holding it (router restart) is fine
        except AdapterSwapError as exc:
            return str(exc)
        return None

    def pick(self, needs: set[str], exclude: Collection[str] = ()) -> Engine:
        """The least busy healthy engine holding ``needs``; :class:`NoEngine` says why there is none."""
        usable = [
            e for e in self.engines if e.healthy and e.url not in exclude and needs <= (e.adapters | self.preloaded)
        ]
        if not usable:
            raise NoEngine(self._why_none(needs))
        turn = next(self._turn)
        n = len(usable)
        return min((usable[(turn + i) % n] for i in range(n)), key=lambda e: e.in_flight)

    def _why_none(self, needs: set[str]) -> str:
        if not any(e.healthy for e in self.engines):
            states = "; ".join(f"{e.url}: {e.reason}" for e in self.engines)
            return f"no healthy SGLang engine ({states})"
        missing = sorted(needs - self.preloaded)
        states = "; ".join(
            f"{e.url}: "
            + (", ".join(f"{a}: {e.failed_adapters.get(a, 'not loaded')}" for a in missing) if e.healthy else e.reason)
            for e in self.engines
        )
        return f"no healthy SGLang engine holds adapter(s) {', '.join(missing)} ({states})"

    @contextlib.contextmanager
    def lease(self, engine: Engine) -> Iterator[Engine]:
        engine.in_flight += 1
        try:
            yield engine
        finally:
            engine.in_flight -= 1
            engine.served += 1

    def status(self) -> dict[str, Any]:
        return {"healthy": sum(e.healthy for e in self.engines), "engines": [e.status() for e in self.engines]}
