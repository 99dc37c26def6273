"""An async client for SGLang's native HTTP API (``/generate``, adapter loading, health).

The HTTP session is passed in: a rollout shares one pooled session across its thousands of requests
(the rollout context owns and closes it). A client given none opens one per request, which suits
one-off callers (an adapter sync, a CLI command) and leaves nothing open behind them. Connection
errors and 5xx answers are retried a bounded number of times with exponential backoff; 4xx answers
are the caller's fault and raise at once, carrying the server's message.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp


class SGLangError(RuntimeError):
    """An SGLang request failed; ``status`` is the HTTP status (None when no answer came)."""

    def __init__(self, url: str, status: int | None, message: str) -> None:
        super().__init__(f"SGLang request to {url} failed ({status if status is not None else 'no answer'}): {message}")
        self.url, self.status, self.message = url, status, message


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    timeout_s: float | None = None  # total per request; None: generation can legitimately take minutes


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
        timeout = aiohttp.ClientTimeout(total=self.retry.timeout_s)
        delay = self.retry.backoff_s
        last_error: SGLangError | None = None
        for attempt in range(self.retry.attempts):
            if attempt:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry.max_backoff_s)
            try:
                status, body, content_type = await self._send(method, url, payload, timeout)
                if status < 400:
                    return _decode(body, content_type)
                last_error = SGLangError(url, status, _error_message(body))
                if status < 500:
                    raise last_error
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
                last_error = SGLangError(url, None, f"{type(exc).__name__}: {exc}")
        assert last_error is not None
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
        return await self.post("/generate", payload)

    async def healthy(self) -> bool:
        try:
            await self.request("GET", "/health")
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
