"""Processes a stage needs beside the trainer (retriever, user simulator): start, wait until ready, watch
for the whole job (restart a dead one a bounded number of times, else stop the job naming it), stop.

Only processes started here are ever stopped, by the process group this module created for them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 20  # how much of a failed service's log a stop message quotes


class ServiceError(RuntimeError):
    pass


@dataclass
class RunningService:
    name: str
    url: str
    process: subprocess.Popen | None  # None: something already answered there, reused, not ours
    log_path: Path | None
    service: Any = None  # the settings it was started from (a restart starts it again from them)


def service_command(service: Any) -> list[str]:
    """The service's argv with ``{host}``, ``{port}`` and ``{python}`` (this interpreter) filled in."""
    fill = {"{host}": service.host, "{port}": str(service.port), "{python}": sys.executable}
    out = []
    for part in service.command:
        part = str(part)
        for key, value in fill.items():
            part = part.replace(key, value)
        out.append(part)
    return out


def is_ready(url: str, timeout_s: float = 2.0) -> bool:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the head's own service: never via a proxy
    try:
        with direct.open(url, timeout=timeout_s) as resp:
            return resp.status < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


def start_service(name: str, service: Any, log_dir: Path, poll_s: float = 1.0) -> RunningService:
    """Start ``service`` unless something already answers at its URL; wait until its ready path answers."""
    ready_url = service.url.rstrip("/") + service.ready_path
    if is_ready(ready_url):
        print(f"[services] {name}: already answering at {service.url}; reusing it")
        return RunningService(name, service.url, None, None, service)
    log_dir.mkdir(parents=True, exist_ok=True)
    running = _launch(name, service, log_dir / f"{name}.log")
    try:
        _wait_ready(running, running.process, ready_url, service.ready_timeout_s, poll_s)
    except BaseException:  # not ready, or Ctrl-C / an error while waiting: never leave it running
        stop_service(running)
        raise
    print(f"[services] {name}: ready at {service.url}")
    return running


def _launch(name: str, service: Any, log_path: Path) -> RunningService:
    """Start the service's process in its own session (its group is what :func:`stop_service` signals), its
    output appended to ``log_path`` and ``service.env`` (e.g. thread caps) added to this environment."""
    argv = service_command(service)
    extra = {str(k): str(v) for k, v in (getattr(service, "env", None) or {}).items()}
    shown = " ".join(f"{k}={v}" for k, v in extra.items())
    print(f"[services] {name}: starting {shown + ' ' if shown else ''}{' '.join(argv)} (log {log_path})")
    with open(log_path, "ab") as log:
        try:
            process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **extra}
            )
        except OSError as exc:
            raise ServiceError(f"service {name}: cannot start {argv[0]}: {exc}") from exc
    return RunningService(name, service.url, process, log_path, service)


def _wait_ready(
    running: RunningService, process: subprocess.Popen, ready_url: str, timeout_s: float, poll_s: float
) -> None:
    """Poll ``ready_url`` until it answers; raise :class:`ServiceError` if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServiceError(
                f"service {running.name} exited with status {process.returncode}; see {running.log_path}"
            )
        if is_ready(ready_url):
            return
        time.sleep(poll_s)
    raise ServiceError(
        f"service {running.name} not ready at {ready_url} after {timeout_s:.0f}s; see {running.log_path}"
    )


def stop_service(running: RunningService, grace_s: float = 10.0) -> None:
    """Stop a service this module started (its own process group); a reused one is left alone."""
    process = running.process
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a service's log (its last 64 KiB read), for a message that says why it died."""
    if path is None or not path.is_file():
        return "(no log: not started here)"
    with open(path, "rb") as f:
        f.seek(max(f.seek(0, os.SEEK_END) - 65536, 0))
        text = f.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:]) or "(the log is empty)"


class ServiceWatch:
    """Watches the stage's services for the whole job, on a daemon thread (``with ServiceWatch(...) as watch``).

    Every service's ready path is polled each ``check_interval_s`` (the shortest of the services'). A service
    whose process exited, or that has not answered for ``unready_timeout_s``, is restarted from its settings,
    at most ``max_restarts`` times in a job; past that (or a reused service, not ours to restart) the watch
    records :attr:`failure` (the service, what happened, its last log lines) and calls ``on_failure`` with it
    once: the caller stops the job (``ray job stop``). Without this a dead retriever aborts every episode and
    the stage trains on nothing, and a dead user simulator leaves slime's dynamic sampling spinning.
    """

    def __init__(self, services: list[RunningService], on_failure: Callable[[str], None]) -> None:
        self.services = services  # updated in place: a restarted service's new process replaces the old
        self.on_failure = on_failure
        self.failure: str | None = None
        self.restarts = {s.name: 0 for s in self.services}
        self._unready_since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        intervals = [float(s.service.check_interval_s) for s in self.services if s.service is not None]
        self.interval_s = min(intervals, default=10.0)

    def check(self) -> str | None:
        """One pass over the services: restart what died; the failure text once one is beyond repair."""
        for i, running in enumerate(self.services):
            problem = self._problem(running)
            while problem is not None:
                allowed = int(running.service.max_restarts)
                if running.process is None or self.restarts[running.name] >= allowed:
                    self.failure = self._failure_text(running, problem, allowed)
                    return self.failure
                self.restarts[running.name] += 1
                print(f"[services] {running.name}: {problem}; restart {self.restarts[running.name]} of {allowed}",
                      file=sys.stderr)  # fmt: skip
                running, problem = self._restart(running)
                self.services[i] = running
        return None

    def _problem(self, running: RunningService) -> str | None:
        if running.process is not None and running.process.poll() is not None:
            return f"exited with status {running.process.returncode}"
        ready_url = running.url.rstrip("/") + running.service.ready_path
        if is_ready(ready_url):
            self._unready_since.pop(running.name, None)
            return None
        since = self._unready_since.setdefault(running.name, time.monotonic())
        waited = time.monotonic() - since
        if waited >= float(running.service.unready_timeout_s):
            return f"has not answered {ready_url} for {waited:.0f}s"
        return None

    def _restart(self, old: RunningService) -> tuple[RunningService, str | None]:
        """Stop what is left of ``old`` and start it again; the new one and what went wrong starting it."""
        stop_service(old)
        self._unready_since.pop(old.name, None)
        assert old.log_path is not None
        try:
            new = _launch(old.name, old.service, old.log_path)
        except ServiceError as exc:
            return old, str(exc)
        ready_url = new.url.rstrip("/") + new.service.ready_path
        deadline = time.monotonic() + float(new.service.ready_timeout_s)
        assert new.process is not None
        while not is_ready(ready_url):  # as _wait_ready, but the end of the job ends the wait too
            if new.process.poll() is not None:
                return new, f"did not come back: exited with status {new.process.returncode}"
            if time.monotonic() >= deadline:
                stop_service(new)
                return new, f"did not come back: not ready after {new.service.ready_timeout_s:.0f}s"
            if self._stop.wait(min(self.interval_s, 1.0)):
                return new, None  # the job ended meanwhile; the caller stops what is running
        print(f"[services] {new.name}: ready again at {new.url}", file=sys.stderr)
        return new, None

    def _failure_text(self, running: RunningService, problem: str, allowed: int) -> str:
        if running.process is None:
            what = f"service {running.name} at {running.url} {problem} (reused, not started here: not restarted)"
        else:
            what = (f"service {running.name} {problem} after {self.restarts[running.name]} restart(s), the most "
                    f"services.{running.name}.max_restarts allows ({allowed})")  # fmt: skip
        tail = log_tail(running.log_path)
        return f"{what}; last lines of {running.log_path}:\n" + "\n".join("  " + line for line in tail.splitlines())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                failure = self.check()
            except Exception as exc:  # noqa: BLE001 - a bug in the watch must not pass silently either
                failure = self.failure = f"the service watch failed: {type(exc).__name__}: {exc}"
            if failure is not None:
                print(f"[services] stopping the job: {failure}", file=sys.stderr)
                try:
                    self.on_failure(failure)
                except Exception as exc:  # noqa: BLE001 - say so; the caller still sees self.failure
                    print(f"[services] could not stop the job: {type(exc).__name__}: {exc}", file=sys.stderr)
                return

    def __enter__(self) -> ServiceWatch:
        if self.services:
            self._thread = threading.Thread(target=self._run, name="aclarena-service-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60.0)
