"""Finding the final answer in a model's response.

Two rules, both settings of the env (``answer_rule``, ``unclosed_think``):

- ``last_closed`` (ours): the last ``\\boxed{...}`` (or ``\\fbox``) whose braces close, after the
  thinking block; a response whose ``<think>`` was never closed (the length limit cut the thinking
  off) has no final answer: whatever it boxed while thinking was a draft.
- the authors' (WillDreamer/ACLArena, ``--rm-type deepscaler``): the text after the last
  ``</think>``, or the whole response when there is none (``slime/slime/rollout/rm_hub/deepscaler.py``
  lines 5-11, their change to slime's, which scores 0 there); in it, the very last ``\\boxed`` — if
  its braces do not close, or it is not followed by ``{``, there is no answer
  (``math_utils.py`` ``last_boxed_only_string`` and ``remove_boxed``, lines 384-419).

Both look at no more than the last ``window`` characters of the text (the answer is at the end):
this runs on the event loop, and a policy can write a megabyte of braces.
"""

from __future__ import annotations

import re
from typing import Literal

AnswerRule = Literal["last_closed", "last"]
UnclosedThink = Literal["no_answer", "whole_response"]

_BOX_BEFORE = re.compile(r"\\(?:boxed|fbox)\s*$")
_BRACE = re.compile(r"[{}]")
_BOX_LOOKBEHIND = 40  # how far before a brace "\boxed  " may start


def after_thinking(text: str, unclosed_think: UnclosedThink = "no_answer") -> str | None:
    """The text after the last ``</think>``; for a ``<think>`` left open, None or the whole text."""
    close = text.rfind("</think>")
    if close >= 0:
        return text[close + len("</think>") :]
    if "<think>" in text and unclosed_think == "no_answer":
        return None
    return text


def last_boxed(text: str, window: int | None = None) -> str | None:
    """The content of the latest-opened ``\\boxed{...}`` whose braces close (None if there is none).

    Scans braces from the end and stops at the first box that closes: the answer is usually near
    the end, and the scan is linear (each ``rfind`` covers a stretch no other one covers again).
    Brace matching depends only on the text after an opening brace, so a box opened inside the
    window matches as it would in the whole text.
    """
    start = max(0, len(text) - window) if window else 0
    closers: list[int] = []
    next_open, next_close = text.rfind("{", start), text.rfind("}", start)
    while next_open >= 0:
        if next_close > next_open:
            closers.append(next_close)
            next_close = text.rfind("}", start, next_close)
            continue
        at = next_open
        if closers:
            close = closers.pop()
            if _BOX_BEFORE.search(text, max(0, at - _BOX_LOOKBEHIND), at):
                return text[at + 1 : close].strip()
        next_open = text.rfind("{", start, at)
    return None


def last_box_only(text: str, window: int | None = None) -> str | None:
    """The authors' rule: the content of the very last ``\\boxed{...}``; None when it does not close."""
    start = max(0, len(text) - window) if window else 0
    at = text.rfind("\\boxed", start)
    if at < 0 or not text.startswith("{", at + len("\\boxed")):
        return None
    depth = 0
    for brace in _BRACE.finditer(text, at):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[at + len("\\boxed{") : brace.start()].strip()
    return None


def final_answer(
    response: str,
    rule: AnswerRule = "last_closed",
    unclosed_think: UnclosedThink = "no_answer",
    window: int | None = None,
) -> str | None:
    visible = after_thinking(response, unclosed_think)
    if visible is None:
        return None
    return last_boxed(visible, window) if rule == "last_closed" else last_box_only(visible, window)
