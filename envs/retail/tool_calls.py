"""Reading tool calls out of the policy's text: Qwen3's ``<tool_call>{"name", "arguments"}</tool_call>``.

The tags are configurable (Hermes-style models use the same ones). Whatever the model wrote, parsing
never raises: a call that cannot be read becomes a :class:`MalformedCall` whose message the model
sees as the tool's answer. Calls inside the thinking block are not calls: only the text after the
last ``</think>`` counts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class MalformedCall:
    """A ``<tool_call>`` block that could not be read; ``error`` says why, for the model."""

    error: str


@dataclass
class ParsedTurn:
    """A model turn split into what it says to the user and the calls it makes, in order."""

    content: str
    calls: list[ToolCall | MalformedCall] = field(default_factory=list)


MAX_NAME_CHARS = 100  # longer than any tool name; a longer one is not echoed back


def _valid_unicode(obj: Any) -> bool:
    """Whether decoded JSON holds no lone surrogate (``"\\ud800"`` is valid JSON, not valid text)."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _read_call(body: str) -> ToolCall | MalformedCall:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return MalformedCall(f"tool call is not valid JSON ({exc})"[:300])
    if not _valid_unicode(obj):  # it would reach the tool answer, the database and the tokenizer
        return MalformedCall("tool call holds a \\u escape of a lone surrogate, which is not valid text")
    if not isinstance(obj, dict):
        return MalformedCall('tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall('tool call has no "name" string')
    if len(name) > MAX_NAME_CHARS:
        return MalformedCall(f'tool call "name" is {len(name)} characters long; no tool name is that long')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI-style: the arguments object encoded as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return MalformedCall(f'"arguments" of {name} is a string that is not a JSON object')
        if not _valid_unicode(arguments):
            return MalformedCall(
                f'"arguments" of {name} hold a \\u escape of a lone surrogate, which is not valid text'
            )
    if not isinstance(arguments, Mapping):
        return MalformedCall(f'"arguments" of {name} must be a JSON object')
    return ToolCall(name, dict(arguments))


class ToolCallParser:
    """Splits a model turn at ``open``/``close`` tags; ``think_end`` marks the end of the thinking."""

    def __init__(
        self, open_tag: str = "<tool_call>", close_tag: str = "</tool_call>", think_end: str = "</think>"
    ) -> None:
        if not open_tag or not close_tag:
            raise ValueError("tool call tags must be non-empty strings")
        self.open_tag, self.close_tag, self.think_end = open_tag, close_tag, think_end

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> ToolCallParser:
        """``{"open": "<tool_call>", "close": "</tool_call>", "think_end": "</think>"}``, each optional."""
        config = dict(config or {})
        unknown = set(config) - {"open", "close", "think_end"}
        if unknown:
            raise ValueError(f"unknown tool_call_format keys {sorted(unknown)}; expected open, close, think_end")
        return cls(
            config.get("open", "<tool_call>"), config.get("close", "</tool_call>"), config.get("think_end", "</think>")
        )

    def visible_text(self, text: str) -> str:
        """The turn without its thinking block."""
        if self.think_end and self.think_end in text:
            return text.rsplit(self.think_end, 1)[1]
        return text

    def parse(self, text: str) -> ParsedTurn:
        """Linear in ``len(text)``: positions move forward, the text is never re-sliced from a call on."""
        rest = self.visible_text(text)
        content: list[str] = []
        calls: list[ToolCall | MalformedCall] = []
        at = 0
        while True:
            start = rest.find(self.open_tag, at)
            if start < 0:
                content.append(rest[at:])
                break
            content.append(rest[at:start])
            body = start + len(self.open_tag)
            end = rest.find(self.close_tag, body)
            if end < 0:
                calls.append(MalformedCall(f"{self.open_tag} without a closing {self.close_tag}"))
                break
            calls.append(_read_call(rest[body:end].strip()))
            at = end + len(self.close_tag)
        return ParsedTurn("".join(content).strip(), calls)
