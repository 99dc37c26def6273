"""Processes a stage needs beside the trainer (retriever, user simulator): start, wait until ready, stop.

Only processes started here are ever stopped, by the process group this module created for them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ServiceError(RuntimeError):
    pass


@dataclass
class RunningService:
    name: str
    url: str
    process: subprocess.Popen | None  # None: something already answered there, reused, not ours
    log_path: Path | None


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
        return RunningService(name, service.url, None, None)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    argv = service_command(service)
    print(f"[services] {name}: starting {' '.join(argv)} (log {log_path})")
    with open(log_path, "ab") as log:
        try:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise ServiceError(f"service {name}: cannot start {argv[0]}: {exc}") from exc
    running = RunningService(name, service.url, process, log_path)
    try:
        _wait_ready(running, process, ready_url, service.ready_timeout_s, poll_s)
    except BaseException:  # not ready, or Ctrl-C / an error while waiting: never leave it running
        stop_service(running)
        raise
    print(f"[services] {name}: ready at {service.url}")
    return running


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
