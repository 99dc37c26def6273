"""``language:response_language`` and ``change_case:*`` — the language and the letter case of the response.

Where language detection cannot decide (no letters at all), the reference counts the instruction as
followed; so do we.
"""

from __future__ import annotations

import random
from typing import Any

from aclarena_envs.ifeval import text
from aclarena_envs.ifeval.checkers.base import RELATIONS, Checker, Param, compare, register
from aclarena_envs.ifeval.vocabulary import LANGUAGES

# The codes langdetect can return (its bundled profiles); a label asking for another can never pass.
_DETECTABLE = (
    "af ar bg bn ca cs cy da de el en es et fa fi fr gu he hi hr hu id it ja kn ko lt lv mk ml mr ne nl no "
    "pa pl pt ro ru sk sl so sq sv sw ta te th tl tr uk ur vi zh-cn zh-tw"
).split()


def _is_language(response: str, code: str) -> bool:
    detected = text.detect_language(response)
    return detected is None or detected == code


@register("language:response_language")
class ResponseLanguage(Checker):
    """langdetect's verdict on the whole response equals ``language``."""

    params = (Param("language", str, choices=tuple(_DETECTABLE)),)

    def check(self, response: str) -> bool:
        return _is_language(response, self.kwargs["language"])

    def describe(self) -> str:
        name = LANGUAGES.get(self.kwargs["language"], self.kwargs["language"])
        return f"Your ENTIRE response must be in {name}; no other language is allowed."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"language": rng.choice(sorted(LANGUAGES))}


@register("change_case:english_capital")
class EnglishCapital(Checker):
    """All cased letters are capitals (``str.isupper``) and the text is English."""

    def check(self, response: str) -> bool:
        return response.isupper() and _is_language(response, "en")

    def describe(self) -> str:
        return "Your entire response must be in English and in capital letters only."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {}


@register("change_case:english_lowercase")
class EnglishLowercase(Checker):
    """All cased letters are lower-case (``str.islower``) and the text is English."""

    def check(self, response: str) -> bool:
        return response.islower() and _is_language(response, "en")

    def describe(self) -> str:
        return "Your entire response must be in English and in lowercase letters only; no capital letters."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {}


@register("change_case:capital_word_frequency")
class CapitalWordFrequency(Checker):
    """Word tokens written all in capitals compared with ``capital_frequency``."""

    params = (Param("capital_frequency", int, minimum=0), Param("capital_relation", str, choices=RELATIONS))

    def check(self, response: str) -> bool:
        capitals = sum(1 for token in text.word_tokens(response) if token.isupper())
        return compare(capitals, self.kwargs["capital_relation"], self.kwargs["capital_frequency"])

    def describe(self) -> str:
        k = self.kwargs
        return (
            f"In your response, words written entirely in capital letters should appear "
            f"{k['capital_relation']} {k['capital_frequency']} times."
        )

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"capital_frequency": rng.randint(1, 20), "capital_relation": rng.choice(RELATIONS)}
