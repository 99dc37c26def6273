"""A generated corpus of fictional places, people and organisations, with questions about them.

Tests and demos need a corpus and QA pairs that ship with the project and raise no licence
questions; every entity here is invented from syllables by a seeded generator, so the same seed
always gives the same corpus. Passages use wiki-18's shape, ``{"id", "contents"}`` with contents
``"Title"\\ntext``, and questions come in single-hop (one passage answers) and multi-hop (two
passages must be chained) kinds, like NQ and HotpotQA.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import write_jsonl_atomic

DEMO_PASSAGES = 3000  # the corpus the search env searches when the recipe names none

_SYLLABLES = (
    "ka ro mi ta ve lun dor bre sa thi qua nel mo zan fir gal hed ia pol rim "
    "sel tor ul ven wy xan bel cor dra esk fal gor hal iv jor kel lor mar nor"
).split()
_OCCUPATIONS = ("cartographer", "glassblower", "astronomer", "shipwright", "composer", "botanist", "engraver")
_INDUSTRIES = ("salt mining", "weaving", "copper smelting", "orchard farming", "river trade", "clockmaking")
_ORG_KINDS = ("Guild", "Academy", "Society", "Company", "Observatory", "Conservatory")
_CLIMATES = ("mild and rainy", "dry with cold winters", "humid in summer", "windy all year")


@dataclass(frozen=True)
class DemoQuestion:
    """A question, its accepted answers and whether answering needs one passage or two."""

    question: str
    answers: list[str]
    hop: str  # "single" | "multi"


@dataclass(frozen=True)
class DemoCorpus:
    passages: list[dict[str, str]]
    questions: list[DemoQuestion]


class _Names:
    """Unique invented names: a name is never reused, so every question has one true answer."""

    def __init__(self, rng: random.Random) -> None:
        self.rng, self.used = rng, set()

    def word(self, low: int = 2, high: int = 4, suffix: str = "") -> str:
        while True:
            name = (
                "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.randint(low, high))) + suffix
            ).capitalize()
            if name not in self.used:
                self.used.add(name)
                return name

    def person(self) -> str:
        while True:
            first = "".join(self.rng.choice(_SYLLABLES) for _ in range(2)).capitalize()
            last = "".join(self.rng.choice(_SYLLABLES) for _ in range(3)).capitalize()
            name = f"{first} {last}"
            if name not in self.used:
                self.used.add(name)
                return name


def _passage(pid: int, title: str, text: str) -> dict[str, str]:
    return {"id": str(pid), "contents": f'"{title}"\n{text}'}


def generate(n_passages: int = 120, seed: int = 0) -> DemoCorpus:
    """About ``n_passages`` passages (exactly that many) and a few questions per group of six.

    Each group is a country, its capital and a second city, two people born there and an
    organisation one of them founded: six passages linked by facts that multi-hop questions chain.
    """
    if n_passages < 1:
        raise ValueError(f"n_passages must be at least 1, got {n_passages}")
    rng = random.Random(seed)
    names = _Names(rng)
    passages: list[dict[str, str]] = []
    questions: list[DemoQuestion] = []
    while len(passages) < n_passages:
        country, capital, town = names.word(suffix="ia"), names.word(), names.word()
        river = names.word()
        founder, other = names.person(), names.person()
        org = f"{names.word()} {rng.choice(_ORG_KINDS)}"
        year, born = rng.randint(1400, 1950), rng.randint(1350, 1900)
        job, industry, climate = rng.choice(_OCCUPATIONS), rng.choice(_INDUSTRIES), rng.choice(_CLIMATES)
        group = [
            (
                country,
                f"{country} is a small inland country. Its capital is {capital}, and the {river} river crosses it "
                f"from north to south. The climate of {country} is {climate}.",
            ),
            (
                capital,
                f"{capital} is the capital city of {country}. It grew around {industry} and lies on the banks of "
                f"the {river} river.",
            ),
            (town, f"{town} is a market town in {country}, known for {industry}. It is upstream of {capital}."),
            (
                founder,
                f"{founder} (born {born}) was a {job} born in {town}, {country}. {founder.split()[0]} founded the "
                f"{org} in {year}.",
            ),
            (
                other,
                f"{other} was a {rng.choice(_OCCUPATIONS)} born in {capital}. {other.split()[0]} studied at the {org}.",
            ),
            (org, f"The {org} is an institution in {capital}, {country}. It was founded in {year} by {founder}."),
        ]
        for title, text in group[: n_passages - len(passages)]:
            passages.append(_passage(len(passages), title, text))
        if len(passages) % len(group):  # a group cut short: its facts are incomplete, ask nothing about it
            break
        questions += [
            DemoQuestion(f"What is the capital of {country}?", [capital], "single"),
            DemoQuestion(f"Who founded the {org}?", [founder], "single"),
            DemoQuestion(f"In which year was the {org} founded?", [str(year)], "single"),
            DemoQuestion(f"In which town was the founder of the {org} born?", [town], "multi"),
            DemoQuestion(f"Which river flows through the capital of {country}?", [river, f"{river} river"], "multi"),
        ]
    return DemoCorpus(passages=passages, questions=questions)


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write one JSON object a line (the corpus format the retriever reads)."""
    write_jsonl_atomic(rows, path)
    return Path(path)
