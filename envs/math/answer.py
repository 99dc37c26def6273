"""Finding the final answer in a model's response.

The final answer is the content of the last ``\\boxed{...}`` after the thinking block. A response
whose ``<think>`` was never closed (the length limit cut the thinking off) has no final answer:
whatever it boxed while thinking was a draft.
"""

from __future__ import annotations

import re

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
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
    """The content of the last ``\\boxed{...}`` with balanced braces (None if there is none)."""
    result = None
    for match in _BOX.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    result = text[start:i]
                    break
    return result.strip() if result is not None else None


def final_answer(response: str) -> str | None:
    visible = after_thinking(response)
    return last_boxed(visible) if visible is not None else None


def as_integer(answer: str) -> int | None:
    """The integer an answer spells, tolerating ``$``, spaces and leading zeros (AIME: ``073`` is 73)."""
    cleaned = answer.strip().strip("$").strip()
    cleaned = re.sub(r"^\\text\{(.*)\}$", r"\1", cleaned).replace("{,}", "").replace("\\,", "").strip()
    return int(cleaned) if _INTEGER.match(cleaned) else None
