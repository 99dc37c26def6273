"""The simulated customer: an LLM behind any OpenAI-compatible chat endpoint, or a script for tests.

As in τ³, the simulator is prompted with the task's ``user_scenario``, sees the agent's messages as
the other side of the chat, and ends the conversation by writing ``###STOP###`` (goal reached),
``###TRANSFER###`` (handed to a human) or ``###OUT-OF-SCOPE###`` (the scenario does not cover what
happens). Anything that goes wrong on the simulator's side (HTTP error, timeout, an answer without
text) raises :class:`~aclarena_slime.plugin.contract.EpisodeAborted`: the episode is dropped, never scored 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import textwrap
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from aclarena_slime.http_service import read_capped
from aclarena_slime.plugin.contract import EpisodeAborted
from aclarena_slime.plugin.settings import from_mapping

log = logging.getLogger(__name__)


def _too_big(what: str) -> EpisodeAborted:
    """A reply past ``max_reply_bytes`` aborts the episode (not worth a retry)."""
    return EpisodeAborted(f"user simulator sent {what} (max_reply_bytes)")

#: The end markers and the episode end reason each one gives.
STOP_MARKERS = {"###STOP###": "user_stop", "###TRANSFER###": "user_transfer", "###OUT-OF-SCOPE###": "user_out_of_scope"}

#: The agent's opening line; τ³'s orchestrator opens every conversation with these words.
AGENT_GREETING = "Hi! How can I help you today?"

GUIDELINES = """You are a customer writing to a customer service agent. Play the customer described in the scenario below.

- Write one message at a time, the way a real customer would.
- Follow the scenario. Do not invent anything it does not give you: what it does not say, you do not know.
- Say things in your own words rather than quoting the scenario.
- Give information only when the agent asks for it, a little at a time.
- Keep going until your goal is reached. Then write ###STOP###.
- If you are transferred to another agent, write ###TRANSFER###.
- If the conversation reaches a point the scenario gives you no way to handle, write ###OUT-OF-SCOPE###."""


def stop_reason(text: str) -> str | None:
    """The end reason if the simulator's message ends the conversation, else ``None``."""
    for marker, reason in STOP_MARKERS.items():
        if marker in text:
            return reason
    return None


def scenario_text(user_scenario: Mapping[str, Any]) -> str:
    """The scenario as the simulator reads it: persona, then the structured instructions."""
    parts = []
    if user_scenario.get("persona"):
        parts.append(f"Persona:\n{textwrap.indent(str(user_scenario['persona']), '    ')}")
    instructions = user_scenario.get("instructions")
    if isinstance(instructions, Mapping):
        labels = [
            ("domain", "Domain"),
            ("reason_for_call", "Reason for call"),
            ("known_info", "Known info"),
            ("unknown_info", "Unknown info"),
            ("task_instructions", "Task instructions"),
        ]
        for key, label in labels:
            if instructions.get(key):
                parts.append(f"{label}:\n{textwrap.indent(str(instructions[key]), '    ')}")
    elif instructions:
        parts.append(str(instructions))
    return "\n".join(parts)


class UserSession(ABC):
    """One simulated customer in one conversation."""

    @abstractmethod
    async def reply(self, agent_text: str) -> str:
        """The customer's answer to the agent's message (the first call gets the greeting)."""


class UserSimulator(ABC):
    """Makes a :class:`UserSession` per episode; holds what sessions share (an HTTP connection pool)."""

    @abstractmethod
    def session(self, scenario: str) -> UserSession:
        """A fresh customer playing ``scenario``."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release shared resources."""


class ScriptedUser(UserSimulator):
    """Answers with fixed lines in order, then ``###STOP###``: deterministic episodes for tests and demos."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = [str(r) for r in replies]

    def session(self, scenario: str) -> UserSession:
        return _ScriptedSession(iter(self.replies))


class _ScriptedSession(UserSession):
    def __init__(self, replies: Any) -> None:
        self._replies = replies
        self.heard: list[str] = []

    async def reply(self, agent_text: str) -> str:
        self.heard.append(agent_text)
        return next(self._replies, "###STOP###")


@dataclass(frozen=True)
class LLMUserSettings:
    """The ``user`` section of the env config for ``kind: llm``: every key :class:`LLMUser` takes."""

    base_url: str = ""
    model: str = ""
    api_key_env: str | None = None
    temperature: float = 0.0
    max_tokens: int | None = None
    timeout_s: float = 120.0
    retries: int = 2
    backoff_s: float = 1.0
    extra_body: dict[str, Any] | None = None
    think_end: str = "</think>"
    max_reply_bytes: int = 1 << 20  # the most of one reply read; a customer's turn is a few hundred bytes

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> LLMUserSettings:
        values = {k: v for k, v in config.items() if k != "kind"}
        return from_mapping(cls, values, "user simulator settings")

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str) or not isinstance(self.model, str) or not self.base_url or not self.model:
            raise ValueError("the LLM user simulator needs base_url and model (env config: user.base_url, user.model)")
        checks = {
            "api_key_env": self.api_key_env is None or isinstance(self.api_key_env, str),
            "temperature": _number(self.temperature) and self.temperature >= 0,
            "max_tokens": self.max_tokens is None or (_integer(self.max_tokens) and self.max_tokens > 0),
            "timeout_s": _number(self.timeout_s) and self.timeout_s > 0,
            "retries": _integer(self.retries) and self.retries >= 0,
            "backoff_s": _number(self.backoff_s) and self.backoff_s >= 0,
            "extra_body": self.extra_body is None or isinstance(self.extra_body, Mapping),
            "think_end": isinstance(self.think_end, str),
            "max_reply_bytes": _integer(self.max_reply_bytes) and self.max_reply_bytes > 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"user simulator setting {name} has a bad value: {getattr(self, name)!r}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class LLMUser(UserSimulator):
    """A simulator behind an OpenAI-compatible ``/chat/completions`` endpoint (vLLM, SGLang, OpenAI...).

    ``base_url`` ends before ``/chat/completions`` (e.g. ``http://host:30001/v1``). The API key, if any,
    is read from the environment variable named by ``api_key_env``, never from the config itself.
    Connection errors, timeouts, 429 and 5xx answers are retried ``retries`` times, waiting ``backoff_s``
    and then twice as long each time, before the episode aborts (logged at WARNING and counted in
    :attr:`failures`). A reply is read only up to ``max_reply_bytes``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        timeout_s: float = 120.0,
        retries: int = 2,
        backoff_s: float = 1.0,
        extra_body: Mapping[str, Any] | None = None,
        think_end: str = "</think>",
        max_reply_bytes: int = 1 << 20,
    ) -> None:
        if not base_url or not model:
            raise ValueError("the LLM user simulator needs base_url and model")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.temperature, self.max_tokens = model, temperature, max_tokens
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.retries, self.backoff_s = retries, backoff_s
        self.extra_body, self.think_end = dict(extra_body or {}), think_end
        self.max_reply_bytes = max_reply_bytes
        self.failures = 0  # replies that failed for good (their episodes aborted)
        self.headers = {}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"environment variable {api_key_env} (the user simulator's API key) is not set")
            self.headers["Authorization"] = f"Bearer {key}"
        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LLMUser:
        """From the env config's ``user`` section; unknown keys and wrong types fail here, not mid-run."""
        return cls(**asdict(LLMUserSettings.from_mapping(config)))

    def session(self, scenario: str) -> UserSession:
        return _LLMSession(self, f"{GUIDELINES}\n\n<scenario>\n{scenario}\n</scenario>")

    async def _client(self) -> aiohttp.ClientSession:
        """The session, made on first use; an aiohttp session belongs to the loop that made it."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=self.timeout, headers=self.headers)
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError(
                "this user simulator was first used on another event loop; an env instance lives on one loop "
                "(build one per loop, as the rollout context does, and aclose() it there)"
            )
        return self._http

    async def complete(self, messages: list[dict[str, str]]) -> str:
        """One chat completion; its text without any thinking block."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            **self.extra_body,
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(self.backoff_s * 2 ** (attempt - 1), 30.0))
            try:
                async with (await self._client()).post(self.url, json=body) as resp:
                    if resp.status >= 500 or resp.status == 429:  # overloaded or rate-limited: worth a retry
                        error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                        continue
                    if resp.status >= 400:
                        raise EpisodeAborted(
                            f"user simulator refused the request: HTTP {resp.status}: {(await resp.text())[:200]}"
                        )
                    payload = json.loads(await read_capped(resp, self.max_reply_bytes, _too_big))
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                continue
            return self._text(payload)
        self.failures += 1
        message = f"user simulator at {self.url} failed after {self.retries + 1} attempts: {error}"
        log.warning("%s (%d replies failed so far; their episodes abort)", message, self.failures)
        raise EpisodeAborted(message)

    def _text(self, payload: Any) -> str:
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise EpisodeAborted(f"user simulator answered without a message ({type(exc).__name__}: {exc})") from exc
        if not isinstance(content, str):
            raise EpisodeAborted("user simulator answered without text")
        if self.think_end and self.think_end in content:
            content = content.rsplit(self.think_end, 1)[1]
        if not content.strip():
            raise EpisodeAborted("user simulator answered with empty text")
        return content.strip()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
        self._http = self._loop = None


class _LLMSession(UserSession):
    """The simulator's side of the chat: the agent speaks as ``user``, the customer as ``assistant``."""

    def __init__(self, sim: LLMUser, system_prompt: str) -> None:
        self.sim = sim
        self.messages = [{"role": "system", "content": system_prompt}]

    async def reply(self, agent_text: str) -> str:
        self.messages.append({"role": "user", "content": agent_text})
        text = await self.sim.complete(self.messages)
        self.messages.append({"role": "assistant", "content": text})
        return text


def build_user_simulator(config: Mapping[str, Any] | None) -> UserSimulator:
    """``{"kind": "llm", "base_url": ..., "model": ...}`` or ``{"kind": "scripted", "replies": [...]}``."""
    config = dict(config or {})
    kind = config.get("kind", "llm")
    if kind == "scripted":
        replies = config.get("replies")
        if not isinstance(replies, list):
            raise ValueError("a scripted user needs 'replies': a list of messages")
        return ScriptedUser(replies)
    if kind == "llm":
        return LLMUser.from_config(config)
    raise ValueError(f"unknown user simulator kind {kind!r}; expected 'llm' or 'scripted'")
