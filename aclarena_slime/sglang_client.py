"""An async client for SGLang's native HTTP API (``/generate``, adapter loading, health).

The HTTP session is passed in: a rollout shares one pooled session across its thousands of requests
(the rollout context owns and closes it). A client given none opens one per request, which suits
one-off callers (an adapter sync, a CLI command) and leaves nothing open behind them. Connection
errors and 5xx answers are retried a bounded number of times (by default slime's own patience, so an
engine that slime's fault tolerance restarts is waited for); 4xx answers are the caller's fault and raise
at once, carrying the server's message. An engine that accepts a request and never answers it fails the
request after ``read_timeout_s``. Every error names the engine's URL.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger(__name__)


class SGLangError(RuntimeError):
    """An SGLang request failed; ``status`` is the HTTP status (None when no answer came)."""

    def __init__(self, url: str, status: int | None, message: str) -> None:
        super().__init__(f"SGLang request to {url} failed ({status if status is not None else 'no answer'}): {message}")
        self.url, self.status, self.message = url, status, message


@dataclass
class RetryPolicy:
    """How long a request waits for its engine; a recipe sets it as ``custom.aclarena_engine``.

    The defaults are slime's own patience (``slime/utils/http_utils.py`` ``_post``: 60 tries, 1 s apart),
    which its engine fault tolerance assumes: an engine restarted within about a minute loses no sample.
    The wait between tries starts at ``backoff_s`` and doubles up to ``max_backoff_s``. ``read_timeout_s``
    bounds the wait for an answer once the request is sent (SGLang's ``/generate`` sends nothing until the
    whole turn is generated, so it must exceed the slowest turn); a request that times out is not retried.
    """

    attempts: int = 60
    backoff_s: float = 1.0
    max_backoff_s: float = 1.0
    timeout_s: float | None = None  # total per request; None: generation can legitimately take minutes
    # A turn of 8k tokens at 10 tok/s (a loaded colocated engine) takes ~14 min: an hour is generous and still bounded.
    read_timeout_s: float | None = 3600.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"aclarena_engine.attempts must be at least 1, got {self.attempts}")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError(
                f"aclarena_engine needs 0 <= backoff_s <= max_backoff_s, got {self.backoff_s} and {self.max_backoff_s}"
            )
        for name in ("timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"aclarena_engine.{name} must be positive (or null for no limit), got {value}")


def new_session() -> aiohttp.ClientSession:
    """A pooled session for many requests on one event loop (a rollout's); its owner closes it."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))


class SGLangClient:
    """Talks to one SGLang endpoint: a server, slime's router, or anything speaking the same API."""

    def __init__(
        self,
        base_url: str,
        retry: RetryPolicy | None = None,
        headers: dict[str, str] | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.headers = headers or {}
        self.session = session  # None: one session per request

    async def request(self, method: str, path: str, payload: Any = None) -> Any:
        url = f"{self.base_url}{path}"
        timeout = aiohttp.ClientTimeout(total=self.retry.timeout_s, sock_read=self.retry.read_timeout_s)
        delay = self.retry.backoff_s
        last_error: SGLangError | None = None
        for attempt in range(self.retry.attempts):
            if attempt:
                if attempt == 1:
                    log.warning("%s; retrying up to %d times", last_error, self.retry.attempts - 1)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry.max_backoff_s)
            try:
                status, body, content_type = await self._send(method, url, payload, timeout)
                if status < 400:
                    return _decode(body, content_type)
                last_error = SGLangError(url, status, _error_message(body))
                if status < 500:
                    raise last_error
            except asyncio.TimeoutError as exc:
                # The engine took the request and did not answer in time: a stuck engine, not a restarting one.
                limits = f"read_timeout_s {self.retry.read_timeout_s}, timeout_s {self.retry.timeout_s}"
                raise SGLangError(url, None, f"no answer within the time allowed ({limits})") from exc
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                last_error = SGLangError(url, None, f"{type(exc).__name__}: {exc}")
        assert last_error is not None
        if self.retry.attempts > 1:
            last_error = SGLangError(
                last_error.url, last_error.status, f"{last_error.message} (gave up after {self.retry.attempts} tries)"
            )
        raise last_error

    async def _send(self, method: str, url: str, payload: Any, timeout: aiohttp.ClientTimeout) -> tuple[int, str, str]:
        if self.session is not None:
            return await _exchange(self.session, method, url, payload, self.headers, timeout)
        async with aiohttp.ClientSession() as session:
            return await _exchange(session, method, url, payload, self.headers, timeout)

    async def post(self, path: str, payload: Any) -> Any:
        return await self.request("POST", path, payload)

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        *,
        lora_path: str | None = None,
        return_logprob: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "input_ids": input_ids,
            "sampling_params": sampling_params,
            "return_logprob": return_logprob,
        }
        if lora_path is not None:
            payload["lora_path"] = lora_path
        payload.update(extra or {})
        response = await self.post("/generate", payload)
        if not isinstance(response, dict):
            # A proxy's error page or a truncated body behind a 200: say so, naming the engine.
            shown = response[:200] if isinstance(response, str) else repr(response)
            raise SGLangError(f"{self.base_url}/generate", 200, f"the answer is not a JSON object: {shown!r}")
        return response

    async def healthy(self) -> bool:
        """One ``/health`` probe, not retried: a probe answers now, it does not wait out a restart."""
        once = RetryPolicy(attempts=1, timeout_s=self.retry.timeout_s, read_timeout_s=self.retry.read_timeout_s)
        try:
            await SGLangClient(self.base_url, once, self.headers, self.session).request("GET", "/health")
        except SGLangError:
            return False
        return True

    async def load_lora_adapter(self, name: str, path: str, pinned: bool = False) -> Any:
        return await self.post("/load_lora_adapter", {"lora_name": name, "lora_path": path, "pinned": pinned})

    async def unload_lora_adapter(self, name: str) -> Any:
        return await self.post("/unload_lora_adapter", {"lora_name": name})


async def _exchange(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    payload: Any,
    headers: dict[str, str],
    timeout: aiohttp.ClientTimeout,
) -> tuple[int, str, str]:
    async with session.request(method, url, json=payload, headers=headers, timeout=timeout) as resp:
        return resp.status, await resp.text(), resp.content_type


def _decode(body: str, content_type: str) -> Any:
    import json

    if not body:
        return None
    if content_type == "application/json" or body[:1] in "{[":
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            pass
    return body


def _error_message(body: str) -> str:
    import json

    try:
        data = json.loads(body)
    except (json.JSONDecodeError, TypeError):
        return body.strip()[:2000] or "(empty body)"
    if isinstance(data, dict):
        for key in ("message", "error", "detail"):
            if key in data:
                value = data[key]
                return value.get("message", str(value)) if isinstance(value, dict) else str(value)
    return str(data)[:2000]


def output_tokens(response: dict[str, Any]) -> tuple[list[int], list[float]]:
    """Token ids and log-probs exactly as SGLang returned them (``output_token_logprobs``)."""
    items = response.get("meta_info", {}).get("output_token_logprobs") or []
    return [int(item[1]) for item in items], [float(item[0]) for item in items]


def finish_reason(response: dict[str, Any]) -> str:
    reason = response.get("meta_info", {}).get("finish_reason")
    if isinstance(reason, dict):
        return str(reason.get("type", "stop"))
    return str(reason or "stop")
