"""``length_constraints:*`` — counts of sentences, words and paragraphs, and a paragraph's first word."""

from __future__ import annotations

import random
import re
from typing import Any

from aclarena_envs.ifeval import text
from aclarena_envs.ifeval.checkers.base import RELATIONS, Checker, LabelError, Param, compare, register
from aclarena_envs.ifeval.vocabulary import WORDS

# A paragraph divider line of three asterisks, with at most one whitespace character either side.
_DIVIDER = re.compile(r"\s?\*\*\*\s?")
# Characters that end the first word of a paragraph.
_WORD_END = frozenset(".,?!'\"")


@register("length_constraints:number_sentences")
class NumberOfSentences(Checker):
    """Punkt sentences compared with ``num_sentences``."""

    params = (Param("num_sentences", int, minimum=0), Param("relation", str, choices=RELATIONS))

    def check(self, response: str) -> bool:
        return compare(text.count_sentences(response), self.kwargs["relation"], self.kwargs["num_sentences"])

    def describe(self) -> str:
        return f"Your response should contain {self.kwargs['relation']} {self.kwargs['num_sentences']} sentences."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"num_sentences": rng.randint(1, 20), "relation": rng.choice(RELATIONS)}


@register("length_constraints:number_words")
class NumberOfWords(Checker):
    """Runs of word characters compared with ``num_words``."""

    params = (Param("num_words", int, minimum=0), Param("relation", str, choices=RELATIONS))

    def check(self, response: str) -> bool:
        return compare(text.count_words(response), self.kwargs["relation"], self.kwargs["num_words"])

    def describe(self) -> str:
        return f"Answer with {self.kwargs['relation']} {self.kwargs['num_words']} words."

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"num_words": rng.randint(50, 400), "relation": rng.choice(RELATIONS)}


@register("length_constraints:number_paragraphs")
class NumberOfParagraphs(Checker):
    """Exactly ``num_paragraphs`` paragraphs separated by ``***``; an empty one inside is a failure."""

    params = (Param("num_paragraphs", int, minimum=0),)

    def check(self, response: str) -> bool:
        paragraphs = _DIVIDER.split(response)
        count = len(paragraphs)
        for index, paragraph in enumerate(paragraphs):
            if not paragraph.strip():
                if index in (0, len(paragraphs) - 1):
                    count -= 1  # a divider at the very start or end adds no paragraph
                else:
                    return False
        return count == self.kwargs["num_paragraphs"]

    def describe(self) -> str:
        return (
            f"Write exactly {self.kwargs['num_paragraphs']} paragraphs, separated from each other by the "
            "markdown divider ***"
        )

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        return {"num_paragraphs": rng.randint(1, 5)}


def _first_word(paragraph: str) -> str:
    """The paragraph's first word, lower-cased, cut at the first punctuation mark, leading quotes dropped."""
    word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    letters = []
    for char in word:
        if char in _WORD_END:
            break
        letters.append(char.lower())
    return "".join(letters)


@register("length_constraints:nth_paragraph_first_word")
class NthParagraphFirstWord(Checker):
    """``num_paragraphs`` paragraphs separated by blank lines, paragraph ``nth_paragraph`` opening with a word."""

    params = (
        Param("num_paragraphs", int, minimum=1),
        Param("nth_paragraph", int, minimum=1),
        Param("first_word", str),
    )

    def _validate(self) -> None:
        if self.kwargs["nth_paragraph"] > self.kwargs["num_paragraphs"]:
            raise LabelError(
                f"{self.id}: nth_paragraph {self.kwargs['nth_paragraph']} is beyond "
                f"num_paragraphs {self.kwargs['num_paragraphs']}"
            )
        self._word = self.kwargs["first_word"].lower()

    def check(self, response: str) -> bool:
        paragraphs = response.split("\n\n")
        count = sum(1 for paragraph in paragraphs if paragraph.strip())
        nth = self.kwargs["nth_paragraph"]
        # As in the reference, the nth piece is counted among all pieces, empty ones included.
        if nth > count:
            return False
        paragraph = paragraphs[nth - 1].strip()
        if not paragraph:
            return False
        return count == self.kwargs["num_paragraphs"] and _first_word(paragraph) == self._word

    def describe(self) -> str:
        k = self.kwargs
        return (
            f"Write exactly {k['num_paragraphs']} paragraphs, separated from each other by one blank line "
            f"(two newlines) and by nothing else. Paragraph {k['nth_paragraph']} must start with the word "
            f'"{k["first_word"]}".'
        )

    @classmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        num = rng.randint(2, 5)
        return {"num_paragraphs": num, "nth_paragraph": rng.randint(1, num), "first_word": rng.choice(WORDS)}
