"""The Search-R1 text protocol: what the model writes, what the environment answers.

The model ends each turn with ``<search> query </search>`` or ``<answer> text </answer>`` (the engine
stops on the closing tag, and may or may not keep it in the text it returns). The environment answers
a search with ``<information>Doc 1(Title: T) text ...</information>``. Tag names, the passage layout
and the instruction prompt follow Search-R1 (PeterGriffinJin/Search-R1, ``search_r1/llm_agent/
generation.py`` and ``scripts/data_process/qa_search_train_merge.py``), so released Search-R1
checkpoints and our policies see the same text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ACTION_TAGS = ("search", "answer")
STOP_STRINGS = ("</search>", "</answer>")

_OPEN = re.compile(r"<(search|answer)>")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"

# Search-R1's instruction for base models, word for word (qa_search_train_merge.py, make_prefix 'base').
INSTRUCTION = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

INVALID_ACTION = (
    "My previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again."
)


@dataclass(frozen=True)
class Action:
    """One parsed model turn. ``kind`` is None when the turn holds no usable action."""

    kind: str | None  # "search" | "answer" | None
    content: str = ""
    closed: bool = False  # the closing tag was in the text (engines may trim the stop string)


def make_prompt(question: str, template: str = INSTRUCTION) -> str:
    """The user prompt for a bare question, normalised as Search-R1 does (stripped, ends with '?').

    ``template`` holds ``{question}``; an empty template leaves the question as it is.
    """
    if not template:
        return question
    question = question.strip()
    if question and not question.endswith("?"):
        question += "?"
    return template.replace("{question}", question)


def parse_action(text: str) -> Action:
    """The turn's action: the first complete ``<search>``/``<answer>`` pair outside ``<think>``, as Search-R1.

    With no complete pair, a trailing unclosed tag counts (engines may trim the stop string) and its
    content runs to the end of the text. No tag at all gives ``Action(None)``, never an exception.

    Linear in ``len(text)``: the obvious regular expressions (``<(search|answer)>(.*?)</\\1>``) rescan
    the rest of the text from every opening tag, and a turn of repeated tags froze the event loop.
    """
    visible = _without_thinking(text)
    closing = {tag: visible.rfind(f"</{tag}>") for tag in ACTION_TAGS}
    last = None
    for match in _OPEN.finditer(visible):
        tag = match.group(1)
        if closing[tag] >= match.end():  # the leftmost opening tag with a closing one after it
            end = visible.find(f"</{tag}>", match.end())
            return Action(tag, visible[match.end() : end].strip(), closed=True)
        last = match
    if last is None:
        return Action(None)
    return Action(last.group(1), visible[last.end() :].strip(), closed=False)


def _without_thinking(text: str) -> str:
    """Each ``<think>...</think>`` block (shortest, left to right) replaced by a space, in one pass."""
    pieces, start = [], 0
    while True:
        opened = text.find(_THINK_OPEN, start)
        closed = text.find(_THINK_CLOSE, opened + len(_THINK_OPEN)) if opened >= 0 else -1
        if closed < 0:  # no later block can close either
            pieces.append(text[start:])
            return " ".join(pieces)
        pieces.append(text[start:opened])
        start = closed + len(_THINK_CLOSE)


def passage_title_and_text(contents: str) -> tuple[str, str]:
    """Split wiki-18 ``contents`` (``"Title"\\ntext``) the way Search-R1 does: first line is the title."""
    title, _, text = contents.partition("\n")
    return title, text


def format_information(documents: Sequence[Mapping[str, Any]]) -> str:
    """``<information>Doc 1(Title: T) text\\nDoc 2(...) ...</information>`` for the retrieved documents."""
    lines = []
    for i, doc in enumerate(documents, start=1):
        title, text = passage_title_and_text(str(doc.get("contents", "")))
        lines.append(f"Doc {i}(Title: {title}) {text}")
    body = "\n".join(lines) if lines else "No passage matched the query. Try different words."
    return f"<information>{body}</information>"


def format_notice(message: str) -> str:
    """A note from the environment in the same wrapper as search results, so the model reads it there."""
    return f"<information>{message}</information>"
