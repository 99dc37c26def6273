"""``keywords:*`` — words that must appear, must not appear, or appear a number of times; letter counts."""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from typing import Any

from aclarena_envs.ifeval.checkers.base import RELATIONS, Checker, LabelError, Param, compare, register
from aclarena_envs.ifeval.vocabulary import WORDS


def _quote_list(words: list[str]) -> str:
    return ", ".join(f'"{word}"' for word in words)


@register("keywords:existence")
class KeywordExistence(Checker):
    """Every keyword occurs somewhere, case-insensitively (substring match, as in the reference)."""

    params = (Param("keywords", list),)

    def _validate(self) -> None:
        # The reference uses each keyword as a regular expression; we match it literally, which is the
        # same on every keyword in IFEval's data and cannot fail on a keyword such as "c++".
        self._patterns = [re.compile(re.escape(word), re.IGNORECASE) for word in sorted(self.kwargs["keywords"])]

    def check(self, response: str) -> bool:
        return all(pattern.search(response) for pattern in self._patterns)

    def describe(self) -> str:
        return f"Include the keywords {_quote_list(self.kwargs['keywords'])} in your response."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"keywords": rng.sample(WORDS, k=2)}


@register("keywords:frequency")
class KeywordFrequency(Checker):
    """Case-insensitive occurrences of the keyword (substrings count) compared with ``frequency``."""

    params = (Param("keyword", str), Param("frequency", int, minimum=0), Param("relation", str, choices=RELATIONS))

    def _validate(self) -> None:
        self._pattern = re.compile(re.escape(self.kwargs["keyword"].strip()), re.IGNORECASE)

    def check(self, response: str) -> bool:
        found = len(self._pattern.findall(response))
        return compare(found, self.kwargs["relation"], self.kwargs["frequency"])

    def describe(self) -> str:
        k = self.kwargs
        return f'In your response, the word "{k["keyword"]}" should appear {k["relation"]} {k["frequency"]} times.'

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"keyword": rng.choice(WORDS), "frequency": rng.randint(1, 3), "relation": rng.choice(RELATIONS)}


@register("keywords:forbidden_words")
class ForbiddenWords(Checker):
    """None of the words occurs as a whole word, case-insensitively."""

    params = (Param("forbidden_words", list),)

    def _validate(self) -> None:
        words = sorted(set(self.kwargs["forbidden_words"]))
        self._patterns = [re.compile(rf"\b{re.escape(word)}\b", re.IGNORECASE) for word in words]

    def check(self, response: str) -> bool:
        return not any(pattern.search(response) for pattern in self._patterns)

    def describe(self) -> str:
        return f"Do not use the words {_quote_list(self.kwargs['forbidden_words'])} anywhere in your response."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"forbidden_words": rng.sample(WORDS, k=2)}


@register("keywords:letter_frequency")
class LetterFrequency(Checker):
    """Occurrences of one character, case-insensitively, compared with ``let_frequency``."""

    params = (
        Param("letter", str),
        Param("let_frequency", int, minimum=0),
        Param("let_relation", str, choices=RELATIONS),
    )

    def _validate(self) -> None:
        letter = self.kwargs["letter"].strip()
        if len(letter) != 1:
            raise LabelError(f"{self.id}: kwarg 'letter' must be one character, got {self.kwargs['letter']!r}")
        self._letter = letter.lower()

    def check(self, response: str) -> bool:
        found = Counter(response.lower())[self._letter]
        return compare(found, self.kwargs["let_relation"], self.kwargs["let_frequency"])

    def describe(self) -> str:
        k = self.kwargs
        return (
            f'In your response, the letter "{self._letter}" should appear {k["let_relation"]} '
            f"{k['let_frequency']} times."
        )

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {
            "letter": rng.choice(string.ascii_lowercase),
            "let_frequency": rng.randint(1, 10),
            "let_relation": rng.choice(RELATIONS),
        }
