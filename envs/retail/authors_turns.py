"""A model turn read as the ACLArena authors' retail agent reads it (``turn_parsing: authors``).

Facts from WillDreamer/ACLArena ``slime/examples/tau-bench/`` and the SGLang they pin (0.5.7):

- each turn stops at the first ``</tool_call>`` (or ``<|im_end|>``) and keeps it (``trainable_agents.py:479-491``);
- the turn goes through SGLang's ``qwen25`` tool parser (``sglang_tool_parser.py``, ``openai_tool_adapter.py``):
  a call is ``<tool_call>\\n{JSON}\\n</tool_call>``, newlines included, found anywhere in the text (inside
  ``<think>`` too); a block whose JSON does not decode, or names no known tool, is skipped with a warning;
  JSON that decodes to something other than an object (or a list of objects) makes the parser raise;
- with no call left the whole text, thinking included, is the message to the customer; with calls, only
  the first runs (``trainable_agents.py:117-131``), and arguments that are not an object turn it back into a
  message (the text before the first ``<tool_call>\\n``);
- a parser exception aborts the episode (``trainable_agents.py:600-612``), scored as aborted.

So a malformed call, an unknown tool, a turn with thinking only, or an empty turn is said to the customer and
the episode goes on. Nothing here is the authors' code: the rules are re-stated from what it does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

CALL_START, CALL_END = "<tool_call>\n", "\n</tool_call>"
_BLOCK = re.compile(re.escape(CALL_START) + "(.*?)" + re.escape(CALL_END), re.DOTALL)
RESPOND, CALL, ABORT = "respond", "call", "abort"


@dataclass(frozen=True)
class AuthorsTurn:
    """What the authors' agent does with a turn: ``respond`` (``content`` goes to the customer), ``call``
    (``name`` runs with ``arguments``) or ``abort`` (``content`` says why)."""

    action: str
    content: str = ""
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


class _ParserRaised(Exception):
    pass


def _calls(text: str, tools: Collection[str]) -> list[tuple[str, Any]]:
    """The (name, arguments) the ``qwen25`` detector keeps, in order."""
    calls = []
    for body in _BLOCK.findall(text):
        try:
            decoded = json.loads(body.strip())
        except json.JSONDecodeError:
            continue  # logged and skipped by the detector
        except RecursionError as exc:
            raise _ParserRaised("tool call JSON nested too deeply") from exc
        for act in decoded if isinstance(decoded, list) else [decoded]:
            if not isinstance(act, dict):
                raise _ParserRaised(f"tool call JSON is a {type(act).__name__}, not an object")
            name = act.get("name")
            if name and name in tools:
                calls.append((name, act.get("parameters") or act.get("arguments", {})))
    return calls


def parse_authors_turn(text: str, tools: Collection[str]) -> AuthorsTurn:
    """The authors' action for a model turn ``text``; ``tools``: the tool names the agent was given."""
    if CALL_START not in text:
        return AuthorsTurn(RESPOND, text)
    try:
        calls = _calls(text, tools)
    except _ParserRaised as exc:
        return AuthorsTurn(ABORT, str(exc))
    if not calls:
        return AuthorsTurn(RESPOND, text)
    before = text[: text.find(CALL_START)].strip()
    name, arguments = calls[0]
    if not isinstance(arguments, dict):
        return AuthorsTurn(RESPOND, before)
    return AuthorsTurn(CALL, before, name, dict(arguments))
