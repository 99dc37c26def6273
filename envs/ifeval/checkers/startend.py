"""``startend:*``, ``combination:*`` and ``punctuation:no_comma`` — how the response begins, ends and splits."""

from __future__ import annotations

import random
from typing import Any

from aclarena_envs.ifeval.checkers.base import Checker, Param, register
from aclarena_envs.ifeval.vocabulary import END_PHRASES

_RESPONSE_SEPARATOR = "******"


@register("startend:end_checker")
class EndPhrase(Checker):
    """The response ends with ``end_phrase`` (case-insensitive; surrounding double quotes ignored)."""

    params = (Param("end_phrase", str),)

    def check(self, response: str) -> bool:
        return response.strip().strip('"').lower().endswith(self.kwargs["end_phrase"].strip().lower())

    def describe(self) -> str:
        return f'Finish your response with the exact phrase "{self.kwargs["end_phrase"]}". Nothing may follow it.'

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"end_phrase": rng.choice(END_PHRASES)}


@register("startend:quotation")
class Quotation(Checker):
    """The whole response is wrapped in double quotation marks."""

    def check(self, response: str) -> bool:
        stripped = response.strip()
        return len(stripped) > 1 and stripped[0] == '"' and stripped[-1] == '"'

    def describe(self) -> str:
        return "Wrap your entire response in double quotation marks."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {}


@register("combination:two_responses")
class TwoResponses(Checker):
    """Two different, non-empty responses separated by six asterisks and nothing else."""

    def check(self, response: str) -> bool:
        parts = response.split(_RESPONSE_SEPARATOR)
        answers = []
        for index, part in enumerate(parts):
            if part.strip():
                answers.append(part.strip())
            elif index not in (0, len(parts) - 1):
                return False  # an empty answer between two separators
        return len(answers) == 2 and answers[0] != answers[1]

    def describe(self) -> str:
        return "Give two different responses, separated by six asterisks ****** and nothing else."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {}


@register("combination:repeat_prompt")
class RepeatPrompt(Checker):
    """The response starts by repeating ``prompt_to_repeat`` (case-insensitive, outer whitespace ignored)."""

    params = (Param("prompt_to_repeat", str),)

    def check(self, response: str) -> bool:
        return response.strip().lower().startswith(self.kwargs["prompt_to_repeat"].strip().lower())

    def describe(self) -> str:
        return (
            "First repeat the request above word for word without change, then give your answer. Do not say "
            "anything before repeating the request, and do not repeat this sentence."
        )

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        # The request to repeat is the generated prompt itself; the generator fills it in.
        return {"prompt_to_repeat": ""}


@register("punctuation:no_comma")
class NoComma(Checker):
    """No comma anywhere."""

    def check(self, response: str) -> bool:
        return "," not in response

    def describe(self) -> str:
        return "Do not use any commas in your entire response."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {}
