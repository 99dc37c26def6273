"""The ACLArena authors' search protocol: a JSON tool call through the Qwen3 tools template.

Facts from WillDreamer/ACLArena ``slime/examples/search-r1/generate_with_search_tools_qwen_sft_no_drift.py``
(the generate function of ``run_qwen3_8b_seq_search.sh``, line 243):

- one tool, ``search(query)``, given to the chat template as an OpenAI-style schema (lines 104-120), so
  the template writes it into the system turn;
- the model calls it with ``<tool_call>{"name": "search", "arguments": {"query": ...}}</tool_call>`` and
  answers with ``<answer> text </answer>``; the engine stops on either closing tag (line 771);
- results go back as a tool message, rendered by the template as
  ``<tool_response>\\nDoc 1(Title: T) text\\n...\\n</tool_response>`` in a user turn (lines 201-208, 516-520);
- a turn with neither a search call nor an answer ends the episode (lines 865-874);
- the user prompt is Search-R1's with the tag instruction replaced by the tool instruction (142-154, 173-194).

Only the first complete ``<tool_call>`` block of a turn counts, as in their parser (lines 283-293); a
search call written as bare JSON counts too (lines 296-311). Parsing is linear in the turn's length
(``str.find`` and one pass over the braces, no backtracking regex).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .protocol import passage_title_and_text

TOOL_STOP_STRINGS = ("</tool_call>", "</answer>")
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

# The tool schema, as the authors give it to the chat template (no_drift.py:104-120).
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search for information using a search engine",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The search query"}},
            "required": ["query"],
        },
    },
}

# The authors' user prompt: Search-R1's "Answer the given question. ... Question: {q}" with the tag
# instruction replaced by theirs (no_drift.py:142-154 and the replacement at 173-179), word for word.
TOOL_INSTRUCTION = (
    "Answer the given question. "
    "First conduct reasoning in english every time you try to get new information.\n"
    "After reasoning, if you find you lack some knowledge, you may call a function to help.\n\n"
    "For each function call, return a JSON object with function name and arguments "
    "within <tool_call></tool_call> XML tags. For example:\n"
    "<tool_call>\n"
    '{"name": "search", "arguments": {"query": "your search query"}}\n'
    "</tool_call>\n"
    "The search results will be returned in <tool_response></tool_response> tags.\n"
    "You can search as many times as you want.\n"
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. \n"
    " Question: {question}\n"
)


@dataclass(frozen=True)
class ToolAction:
    """One parsed model turn: ``kind`` is "search", "answer" or None (neither: the episode ends)."""

    kind: str | None
    content: str = ""


def _between(text: str, open_tag: str, close_tag: str) -> str | None:
    """The text between the first ``open_tag`` and the next ``close_tag`` after it; None without a pair."""
    start = text.find(open_tag)
    if start < 0:
        return None
    end = text.find(close_tag, start + len(open_tag))
    return None if end < 0 else text[start + len(open_tag) : end]


def _search_query(body: str) -> str | None:
    """The query of a ``{"name": "search", "arguments": {"query": str}}`` call; None for anything else."""
    try:
        call = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(call, list):  # the authors accept a one-element list (no_drift.py:260-261)
        call = call[0] if call else None
    if not isinstance(call, dict) or call.get("name") != "search":
        return None
    arguments = call.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    query = arguments.get("query", "") if isinstance(arguments, dict) else None
    return query.strip() if isinstance(query, str) else None


def _bare_search_query(text: str) -> str | None:
    """The authors' fallback: a search call written as bare JSON, without the tags (qa_em_format_qwen_sft.py:43-70).

    Their pattern is an object with exactly one brace-free inner object (``{... "arguments": {...} ...}``).
    Such objects are runs of four consecutive braces ``{ { } }`` among the turn's braces, found in one pass;
    the leftmost that reads as a search call wins.
    """
    braces = [(i, c) for i, c in enumerate(text) if c in "{}"]
    for k in range(len(braces) - 3):
        if "".join(c for _, c in braces[k : k + 4]) == "{{}}":
            query = _search_query(text[braces[k][0] : braces[k + 3][0] + 1])
            if query is not None:
                return query
    return None


def parse_tool_action(text: str) -> ToolAction:
    """The turn's action, in the authors' order: a tagged search call, a bare one, then an answer."""
    body = _between(text, CALL_OPEN, CALL_CLOSE)
    query = _search_query(body.strip()) if body is not None else None
    if query is None:
        query = _bare_search_query(text)
    if query is not None:
        return ToolAction("search", query)
    answer = _between(text, ANSWER_OPEN, ANSWER_CLOSE)
    if answer is not None:
        return ToolAction("answer", answer.strip())
    return ToolAction(None)


def format_passages(documents: Sequence[Mapping[str, Any]]) -> str:
    """``Doc 1(Title: T) text\\nDoc 2(...) ...``: the tool message's content (no_drift.py:201-208, stripped)."""
    lines = []
    for i, doc in enumerate(documents, start=1):
        title, text = passage_title_and_text(str(doc.get("contents", "")))
        lines.append(f"Doc {i}(Title: {title}) {text}")
    return "\n".join(lines)


_TAG = re.compile(r"</?(?:tool_call|tool_response|answer)>")
# Allowed tag after each state (the authors' is_valid_sequence, qa_em_format_qwen_sft.py:103-155).
_NEXT = {
    ("start", CALL_OPEN): "in_call",
    ("response_done", CALL_OPEN): "in_call",
    ("in_call", CALL_CLOSE): "call_done",
    ("call_done", RESPONSE_OPEN): "in_response",
    ("in_response", RESPONSE_CLOSE): "response_done",
    ("start", ANSWER_OPEN): "in_answer",
    ("call_done", ANSWER_OPEN): "in_answer",
    ("response_done", ANSWER_OPEN): "in_answer",
    ("in_answer", ANSWER_CLOSE): "end",
}


def well_formed(trajectory: str) -> bool:
    """The authors' format rule over the assistant side of a trajectory (turns and tool responses).

    Tags must come as ``(<tool_call></tool_call><tool_response></tool_response>)* <answer></answer>``
    with any text between them, and end after the answer; anything else (a call inside the thinking
    that was never run, a second answer, an unclosed tag) is malformed.
    """
    state = "start"
    for match in _TAG.finditer(trajectory):
        state = _NEXT.get((state, match.group(0)), "bad")
        if state == "bad":
            return False
    return state == "end"
