"""Verifiable training prompts composed from the checker registry, reproducible from a seed.

Each prompt is a request about a topic followed by one to ``max_instructions`` instructions drawn
from the registry. Instructions that contradict each other (all capitals and all lowercase; a JSON
answer and a postscript) are never drawn together, and the words one instruction requires are never
forbidden by another. Every drawn kwargs set is built into its checker, so a generated label is one
the scorer accepts.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from aclarena_envs.ifeval.checkers import INSTRUCTIONS, build_checker
from aclarena_envs.ifeval.reward import Label
from aclarena_envs.ifeval.vocabulary import TOPICS

# Instructions that shape the whole answer and leave room for almost nothing else.
_EXCLUSIVE = {
    "detectable_format:constrained_response": set(),
    "detectable_format:json_format": {"keywords:existence", "keywords:forbidden_words"},
    "combination:two_responses": {"keywords:existence", "keywords:forbidden_words", "punctuation:no_comma"},
    "combination:repeat_prompt": {"keywords:existence", "punctuation:no_comma"},
}
# Pairs that cannot both hold (or that measure the same thing in two ways).
_CONFLICTS = [
    ("change_case:english_capital", "change_case:english_lowercase"),
    ("change_case:capital_word_frequency", "change_case:english_capital"),
    ("change_case:capital_word_frequency", "change_case:english_lowercase"),
    ("length_constraints:number_paragraphs", "length_constraints:nth_paragraph_first_word"),
    ("length_constraints:number_paragraphs", "length_constraints:number_sentences"),
    ("startend:quotation", "detectable_format:title"),
    ("detectable_format:multiple_sections", "detectable_format:number_highlighted_sections"),
    # Section words are matched case-sensitively ("Section 1"), so they fight a forced letter case.
    ("detectable_format:multiple_sections", "change_case:english_capital"),
    ("detectable_format:multiple_sections", "change_case:english_lowercase"),
] + [
    # A non-English answer cannot carry English keywords, casing or phrases.
    ("language:response_language", other)
    for other in (
        "change_case:english_capital",
        "change_case:english_lowercase",
        "change_case:capital_word_frequency",
        "keywords:existence",
        "keywords:frequency",
        "keywords:forbidden_words",
        "keywords:letter_frequency",
        "startend:end_checker",
        "detectable_format:multiple_sections",
        "length_constraints:nth_paragraph_first_word",
    )
]
_WORD_KWARGS = ("keywords", "forbidden_words", "keyword", "first_word")

_REQUESTS = (
    "Write a short piece about {topic}.",
    "Explain {topic} to a curious friend.",
    "Write a blog post about {topic}.",
    "Describe {topic}.",
    "Write a story that involves {topic}.",
)


def compatible(first: str, second: str) -> bool:
    """Whether two instruction ids may appear in one prompt."""
    if first == second:
        return False
    for one, other in ((first, second), (second, first)):
        if one in _EXCLUSIVE and other not in _EXCLUSIVE[one]:
            return False
    return (first, second) not in _CONFLICT_SET and (second, first) not in _CONFLICT_SET


_CONFLICT_SET = frozenset(_CONFLICTS)


def _words(kwargs: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    for key in _WORD_KWARGS:
        value = kwargs.get(key)
        found.update(w.lower() for w in ([value] if isinstance(value, str) else value or []))
    return found


@dataclass(frozen=True)
class GeneratedPrompt:
    prompt: str
    label: Label

    def to_slime(self, index: int, seed: int, tag: str = "ifeval") -> dict[str, Any]:
        """A slime JSONL record (``metadata.env``: ``tag``); the label is JSON text so columnar readers keep it intact."""
        metadata = {"env": tag, "source": "generated", "seed": seed, "index": index}
        return {"prompt": self.prompt, "label": self.label.to_json(), "metadata": metadata}


def generate_one(rng: random.Random, max_instructions: int = 3, ids: Sequence[str] | None = None) -> GeneratedPrompt:
    """One prompt with 1..max_instructions mutually compatible instructions."""
    pool = sorted(ids if ids is not None else INSTRUCTIONS)
    request = rng.choice(_REQUESTS).format(topic=rng.choice(TOPICS))
    count = rng.randint(1, max(1, max_instructions))
    chosen: list[str] = []
    kwargs_list: list[dict[str, Any]] = []
    used_words: set[str] = set()
    for instruction_id in rng.sample(pool, k=len(pool)):
        if len(chosen) == count:
            break
        if not all(compatible(instruction_id, other) for other in chosen):
            continue
        kwargs = _draw_kwargs(instruction_id, rng, used_words, request)
        if kwargs is None:
            continue
        chosen.append(instruction_id)
        kwargs_list.append(kwargs)
        used_words |= _words(kwargs)
    label = Label(tuple(chosen), tuple(kwargs_list))
    sentences = [checker.describe() for checker in label.checkers()]
    return GeneratedPrompt(" ".join([request, *sentences]), label)


def _draw_kwargs(instruction_id: str, rng: random.Random, used: set[str], request: str) -> dict[str, Any] | None:
    """Kwargs for one instruction that share no word with those already drawn (None after a few tries)."""
    cls = INSTRUCTIONS[instruction_id]
    for _ in range(8):
        kwargs = cls.sample_kwargs(rng)
        if "prompt_to_repeat" in kwargs:
            kwargs["prompt_to_repeat"] = request
        if not (_words(kwargs) & used):
            build_checker(instruction_id, kwargs)  # a generated label must be one the scorer accepts
            return kwargs
    return None


def generate(count: int, seed: int, max_instructions: int = 3) -> Iterator[GeneratedPrompt]:
    """``count`` prompts; the same seed gives the same prompts."""
    rng = random.Random(seed)
    for _ in range(count):
        yield generate_one(rng, max_instructions)
