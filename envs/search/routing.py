"""Search requests as a client of the router writes them (NQ / HotpotQA-style questions), for its tag classifier.

The demo records ask about a fictional corpus; these add questions about real-world names, with and
without the Search-R1 instruction.
"""

from __future__ import annotations

import random

_NAMES = ["Alice", "Ben", "Chen", "Dana", "Emil", "Farah", "Gita", "Hugo", "Ines", "Jun", "Kofi", "Lena"]
_THINGS = ["the Eiffel Tower", "the Nile", "Mount Fuji", "the Beatles", "NASA", "the Roman Empire",
           "Harvard University", "the Great Wall", "Wikipedia", "the Amazon rainforest", "Real Madrid",
           "the Louvre", "Tesla", "the Olympic Games", "Shakespeare", "the Mona Lisa", "Apollo 11"]  # fmt: skip


def prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` open-domain questions, reproducible from ``seed`` (the templates repeat: expect duplicates)."""
    r = random.Random(seed)
    return [_question(r) for _ in range(n)]


def _question(r: random.Random) -> str:
    thing, name = r.choice(_THINGS), r.choice(_NAMES)
    question = r.choice(
        [
            f"who founded {thing}?",
            f"when was {thing} built?",
            f"where is {thing} located?",
            f"what country is {thing} in?",
            f"who wrote the book about {thing}?",
            f"which year did {thing} first appear in the news?",
            f"who played {name} in the film about {thing}?",
            f"what is the name of the river near {thing}?",
            f"how tall is {thing}?",
            f"who was the director of the documentary on {thing}?",
            f"which city hosted the {r.randint(1950, 2020)} world cup final?",
            f"who is the current president of the company that owns {thing}?",
        ]
    )
    suffix = r.choice(
        [
            "",
            " Think first. When you need facts, search with <search> query </search>; "
            "results come back in <information></information>. Give the final answer in <answer></answer>.",
        ]
    )
    return f"Question: {question}{suffix}" if suffix else question
