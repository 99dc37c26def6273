"""Instruction-following requests as a client of the router writes them (IFEval-style), for its tag classifier.

The demo records come from the checker registry's templates; these add the short constraint phrasings
of IFEval's own prompts.
"""

from __future__ import annotations

import random

_TOPICS = ["a summer vacation", "climate change", "a new smartphone", "your favourite city", "friendship",
           "the history of tea", "remote work", "a local bakery", "learning to code", "a rainy day"]  # fmt: skip
_GENRES = ["an essay", "a poem", "a blog post", "a short story", "a letter", "a product description"]


def prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` writing requests with one verifiable constraint each, reproducible from ``seed``."""
    r = random.Random(seed)
    return [_request(r) for _ in range(n)]


def _request(r: random.Random) -> str:
    genre, topic = r.choice(_GENRES), r.choice(_TOPICS)
    k = r.randint(2, 6)
    constraint = r.choice(
        [
            f"Your response should contain at least {k} paragraphs separated by ***.",
            "Do not use any commas in your response.",
            "Wrap your entire response in double quotation marks.",
            "Include a title wrapped in double angular brackets, such as <<my title>>.",
            "Your entire response must be in lowercase letters.",
            f"Highlight at least {k} sections with markdown, i.e. *highlighted section*.",
            "Finish your response with the exact phrase 'Any other questions?'.",
            f"Answer with fewer than {k * 50} words.",
            f"The word 'bright' should appear at least {k} times.",
            "Your response must be in French, no other language is allowed.",
            f"Use exactly {k} bullet points in markdown format.",
        ]
    )
    return f"Write {genre} about {topic}. {constraint}"
