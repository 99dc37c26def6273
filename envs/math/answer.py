"""Finding the final answer in a model's response.

The final answer is the content of the last ``\\boxed{...}`` after the thinking block. A response
whose ``<think>`` was never closed (the length limit cut the thinking off) has no final answer:
whatever it boxed while thinking was a draft.
"""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")
_INTEGER = re.compile(r"^[+-]?\d+$")


def after_thinking(text: str) -> str | None:
    """The text after the last ``</think>``; None when a ``<think>`` is left open."""
    close = text.rfind("</think>")
    if close >= 0:
        return text[close + len("</think>") :]
    if "<think>" in text:
        return None
    return text


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` with balanced braces (None if there is none).

    One pass with a stack of open braces (a rescan per ``\\boxed{`` is quadratic, and this runs on
    the event loop on responses of tens of thousands of characters).
    """
    box_braces = {match.end() - 1 for match in _BOX.finditer(text)}
    open_braces: list[int] = []
    best: tuple[int, int] | None = None  # (content start, content end) of the latest-opened closed box
    for brace in _BRACE.finditer(text):
        at = brace.start()
        if text[at] == "{":
            open_braces.append(at)
        elif open_braces:
            opened = open_braces.pop()
            if opened in box_braces and (best is None or opened + 1 > best[0]):
                best = (opened + 1, at)
    return text[best[0] : best[1]].strip() if best is not None else None


def final_answer(response: str) -> str | None:
    visible = after_thinking(response)
    return last_boxed(visible) if visible is not None else None


def as_integer(answer: str) -> int | None:
    """The integer an answer spells, tolerating ``$``, spaces and leading zeros (AIME: ``073`` is 73)."""
    cleaned = answer.strip().strip("$").strip()
    cleaned = re.sub(r"^\\text\{(.*)\}$", r"\1", cleaned).replace("{,}", "").replace("\\,", "").strip()
    return int(cleaned) if _INTEGER.match(cleaned) else None
