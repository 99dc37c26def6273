"""``detectable_format:*`` and ``detectable_content:*`` — markdown shapes, JSON, titles, placeholders, postscripts."""

from __future__ import annotations

import json
import random
import re
from typing import Any

from aclarena_envs.ifeval.checkers.base import Checker, Param, register
from aclarena_envs.ifeval.vocabulary import POSTSCRIPT_MARKERS, SECTION_WORDS

# The reference's patterns, read with the regex engine, backtrack quadratically on runs of newlines, tabs,
# ``[`` or ``<``; the counters below give the same answers in one pass (a test compares them):
# placeholders ``\[.*?\]``, bullets ``^\s*\*[^\*].*$`` and ``^\s*-.*$`` (MULTILINE), titles ``<<[^\n]+>>``.
_HIGHLIGHT = re.compile(r"\*[^\n\*]*\*")
_BOLD = re.compile(r"\*\*[^\n\*]*\*\*")
_WHITESPACE_RUN = re.compile(r"\s+")
_STAR_ITEM = re.compile(r"\*[^*]")  # what follows a bullet's leading whitespace
_DASH_ITEM = re.compile(r"-")
# IFEval's fixed answer options for constrained_response.
CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
_JSON_FENCES = ("```json", "```Json", "```JSON", "```")


@register("detectable_content:number_placeholders")
class Placeholders(Checker):
    """At least ``num_placeholders`` square-bracket placeholders such as ``[address]``."""

    params = (Param("num_placeholders", int, minimum=0),)

    def check(self, response: str) -> bool:
        return count_placeholders(response) >= self.kwargs["num_placeholders"]

    def describe(self) -> str:
        return f"Include at least {self.kwargs['num_placeholders']} placeholders in square brackets, such as [name]."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"num_placeholders": rng.randint(1, 4)}


@register("detectable_content:postscript")
class Postscript(Checker):
    """A postscript marker appears (case-insensitively); ``P.S.`` and ``P.P.S`` allow a space after each dot."""

    params = (Param("postscript_marker", str),)

    def _validate(self) -> None:
        marker = self.kwargs["postscript_marker"].strip()
        if marker == "P.P.S":
            pattern = r"p\.\s?p\.\s?s"
        elif marker == "P.S.":
            pattern = r"p\.\s?s\."
        else:  # the reference inserts other markers as a regex; we match them literally
            pattern = re.escape(marker.lower())
        # The reference's pattern is wrapped in ``\s*`` ... ``.*$`` (MULTILINE), which match anywhere and
        # change nothing for a search, but backtrack quadratically on long runs of whitespace.
        self._marker = marker
        self._pattern = re.compile(pattern)

    def check(self, response: str) -> bool:
        return self._pattern.search(response.lower()) is not None

    def describe(self) -> str:
        return f"At the end of your response, add a postscript starting with {self._marker}"

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"postscript_marker": rng.choice(POSTSCRIPT_MARKERS)}


@register("detectable_format:number_bullet_lists")
class BulletList(Checker):
    """Exactly ``num_bullets`` markdown bullet lines (``* item`` or ``- item``)."""

    params = (Param("num_bullets", int, minimum=0),)

    def check(self, response: str) -> bool:
        count = count_bullets(response, _STAR_ITEM) + count_bullets(response, _DASH_ITEM)
        return count == self.kwargs["num_bullets"]

    def describe(self) -> str:
        return (
            f"Your answer must contain exactly {self.kwargs['num_bullets']} bullet points, written as "
            "markdown bullets:\n* This is one point.\n* This is another point."
        )

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"num_bullets": rng.randint(1, 5)}


@register("detectable_format:constrained_response")
class ConstrainedResponse(Checker):
    """The response contains one of IFEval's three fixed answers."""

    def check(self, response: str) -> bool:
        stripped = response.strip()
        return any(option in stripped for option in CONSTRAINED_OPTIONS)

    def describe(self) -> str:
        return "Answer with one of the following options: " + ", ".join(f'"{o}"' for o in CONSTRAINED_OPTIONS)

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {}


@register("detectable_format:number_highlighted_sections")
class HighlightedSections(Checker):
    """At least ``num_highlights`` non-empty ``*highlights*``; each ``**bold**`` span counts once more."""

    params = (Param("num_highlights", int, minimum=0),)

    def check(self, response: str) -> bool:
        count = sum(1 for span in _HIGHLIGHT.findall(response) if span.strip("*").strip())
        count += sum(1 for span in _BOLD.findall(response) if span[2:-2].strip())
        return count >= self.kwargs["num_highlights"]

    def describe(self) -> str:
        return (
            f"Highlight at least {self.kwargs['num_highlights']} sections of your answer with markdown, "
            "like *this highlighted section*."
        )

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"num_highlights": rng.randint(1, 4)}


@register("detectable_format:multiple_sections")
class MultipleSections(Checker):
    """At least ``num_sections`` sections, each opened by the splitter word and a number (``Section 2``)."""

    params = (Param("section_spliter", str), Param("num_sections", int, minimum=0))

    def _validate(self) -> None:
        # The reference inserts the splitter into its pattern unescaped; splitters are plain words.
        word = re.escape(self.kwargs["section_spliter"].strip())
        self._splitter = re.compile(r"\s?" + word + r"\s?\d+\s?")

    def check(self, response: str) -> bool:
        return len(self._splitter.split(response)) - 1 >= self.kwargs["num_sections"]

    def describe(self) -> str:
        word, num = self.kwargs["section_spliter"].strip(), self.kwargs["num_sections"]
        return (
            f"Your response must have {num} sections. Begin each section with {word} and its number, "
            f"for example:\n{word} 1\n[content of section 1]\n{word} 2\n[content of section 2]"
        )

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"section_spliter": rng.choice(SECTION_WORDS), "num_sections": rng.randint(2, 5)}


@register("detectable_format:json_format")
class JsonFormat(Checker):
    """The whole response parses as JSON, optionally inside one markdown code fence."""

    def check(self, response: str) -> bool:
        body = response.strip()
        for fence in _JSON_FENCES:  # chained in the reference's order: "```json" then "```" can both go
            body = body.removeprefix(fence)
        body = body.removesuffix("```").strip()
        try:
            json.loads(body)
        except (ValueError, RecursionError):  # absurdly deep nesting is model output too, not a crash
            return False
        return True

    def describe(self) -> str:
        return "Wrap your entire output in JSON format. You may use markdown code fences such as ```."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {}


@register("detectable_format:title")
class Title(Checker):
    """A non-empty title in double angular brackets on one line, such as ``<<poem of joy>>``."""

    def check(self, response: str) -> bool:
        return any(_line_title(line) for line in response.split("\n"))

    def describe(self) -> str:
        return "Your answer must contain a title wrapped in double angular brackets, such as <<poem of joy>>."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {}


def count_placeholders(response: str) -> int:
    """Matches of ``\\[.*?\\]``: a ``[`` and the first ``]`` after it on the same line."""
    count = 0
    for line in response.split("\n"):
        start = line.find("[")
        while start >= 0:
            end = line.find("]", start + 1)
            if end < 0:  # no later "[" on this line can close either
                break
            count += 1
            start = line.find("[", end + 1)
    return count


def count_bullets(response: str, item: re.Pattern[str]) -> int:
    """Matches of ``^\\s*<item>.*$`` (MULTILINE), in one pass.

    ``\\s*`` may cross newlines, so a bullet starts at a line start from which only whitespace leads
    to the item; the match runs to the end of the line where the item ends.
    """
    run_starts = {m.end(): m.start() for m in _WHITESPACE_RUN.finditer(response)}
    count, resume = 0, 0  # resume: where the regex engine goes on after the last match
    for marker in item.finditer(response):
        q = marker.start()
        if q < resume:
            continue
        low = max(run_starts.get(q, q), resume)  # the earliest start from which only whitespace leads to q
        if low > 0 and response.find("\n", low - 1, q) < 0:  # no line start in [low, q]
            continue
        count += 1
        end = response.find("\n", marker.end())
        resume = len(response) + 1 if end < 0 else end
    return count


def _line_title(line: str) -> bool:
    """Whether ``<<[^\\n]+>>`` matches on this line with a non-blank title: first ``<<`` to last ``>>``."""
    start, end = line.find("<<"), line.rfind(">>")
    return start >= 0 and end >= start + 3 and bool(line[start : end + 2].lstrip("<").rstrip(">").strip())
