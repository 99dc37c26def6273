"""``detectable_format:*`` and ``detectable_content:*`` — markdown shapes, JSON, titles, placeholders, postscripts."""

from __future__ import annotations

import json
import random
import re
from typing import Any

from aclarena_envs.ifeval.checkers.base import Checker, Param, register
from aclarena_envs.ifeval.vocabulary import POSTSCRIPT_MARKERS, SECTION_WORDS

_PLACEHOLDER = re.compile(r"\[.*?\]")
_STAR_BULLET = re.compile(r"^\s*\*[^\*].*$", re.MULTILINE)
_DASH_BULLET = re.compile(r"^\s*-.*$", re.MULTILINE)
_HIGHLIGHT = re.compile(r"\*[^\n\*]*\*")
_BOLD = re.compile(r"\*\*[^\n\*]*\*\*")
_TITLE = re.compile(r"<<[^\n]+>>")
# IFEval's fixed answer options for constrained_response.
CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
_JSON_FENCES = ("```json", "```Json", "```JSON", "```")


@register("detectable_content:number_placeholders")
class Placeholders(Checker):
    """At least ``num_placeholders`` square-bracket placeholders such as ``[address]``."""

    params = (Param("num_placeholders", int, minimum=0),)

    def check(self, response: str) -> bool:
        return len(_PLACEHOLDER.findall(response)) >= self.kwargs["num_placeholders"]

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
            pattern = r"\s*p\.\s?p\.\s?s.*$"
        elif marker == "P.S.":
            pattern = r"\s*p\.\s?s\..*$"
        else:  # the reference inserts other markers as a regex; we match them literally
            pattern = r"\s*" + re.escape(marker.lower()) + r".*$"
        self._marker = marker
        self._pattern = re.compile(pattern, re.MULTILINE)

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
        count = len(_STAR_BULLET.findall(response)) + len(_DASH_BULLET.findall(response))
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
        return any(title.lstrip("<").rstrip(">").strip() for title in _TITLE.findall(response))

    def describe(self) -> str:
        return "Your answer must contain a title wrapped in double angular brackets, such as <<poem of joy>>."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {}
