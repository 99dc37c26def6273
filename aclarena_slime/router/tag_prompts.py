"""Labelled prompts of the four environments, to train and measure the tag classifier.

Each env contributes its own ``demo_records`` when its plugin has them, plus prompts generated here
from templates in the style of its data (AIME-like problems, NQ/HotpotQA-like questions, τ-retail
customer messages, IFEval-like instructions), so the classifier never sees only one phrasing.
Nothing is downloaded. Held-out prompts are drawn with a different seed and ``exclude=`` the training
texts: the templates repeat themselves, so another seed alone would test on training prompts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping
from typing import Any

from aclarena_slime.registry import PluginLoadError, UnknownEnvironment, get_environment

TAGS = ("math", "search", "retail", "ifeval")

_NAMES = ["Alice", "Ben", "Chen", "Dana", "Emil", "Farah", "Gita", "Hugo", "Ines", "Jun", "Kofi", "Lena"]
_THINGS = ["the Eiffel Tower", "the Nile", "Mount Fuji", "the Beatles", "NASA", "the Roman Empire",
           "Harvard University", "the Great Wall", "Wikipedia", "the Amazon rainforest", "Real Madrid",
           "the Louvre", "Tesla", "the Olympic Games", "Shakespeare", "the Mona Lisa", "Apollo 11"]  # fmt: skip
_ITEMS = ["mechanical keyboard", "water bottle", "hiking boots", "desk lamp", "t-shirt", "office chair",
          "bluetooth speaker", "backpack", "smart watch", "coffee maker", "laptop sleeve", "wireless earbuds"]  # fmt: skip
_TOPICS = ["a summer vacation", "climate change", "a new smartphone", "your favourite city", "friendship",
           "the history of tea", "remote work", "a local bakery", "learning to code", "a rainy day"]  # fmt: skip


def _math(r: random.Random) -> str:
    a, b, c = r.randint(2, 99), r.randint(2, 99), r.randint(3, 999)
    problem = r.choice(
        [
            f"Find the remainder when {a}^{b} is divided by {c}.",
            f"Let x and y be real numbers with x + y = {a} and xy = {b}. Find x^2 + y^2.",
            f"How many positive integers less than {c} are divisible by {a % 9 + 2} but not by {b % 7 + 3}?",
            f"A triangle has side lengths {a}, {b} and {a + b - 1}. Find the area of the triangle.",
            f"Solve for x: {a}x + {b} = {c}.",
            f"What is {a} * {b} - {c}?",
            f"The sum of the first n positive odd integers is {a * a}. Find n.",
            f"In how many ways can {a % 8 + 3} people be seated around a round table?",
            f"Compute the number of ordered pairs (m, n) of positive integers with m + n = {c} and gcd(m, n) = 1.",
            f"Let f(x) = x^2 - {a}x + {b}. Find the sum of the roots of f(f(x)) = 0.",
            f"A fair die is rolled {a % 5 + 2} times. The probability that the sum is {b % 20 + 5} is p/q. Find p + q.",
            f"Find the smallest positive integer k such that {a}k is a perfect square.",
        ]
    )
    return problem + r.choice(["", " Please reason step by step, and put your final answer within \\boxed{}."])


def _search(r: random.Random) -> str:
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


def _retail(r: random.Random) -> str:
    item, name = r.choice(_ITEMS), r.choice(_NAMES)
    order = f"#W{r.randint(1000000, 9999999)}"
    message = r.choice(
        [
            f"Hi, I want to return the {item} from order {order}.",
            f"I'd like to exchange my {item} for a different color.",
            f"Can you cancel order {order}? I ordered it by mistake.",
            f"My name is {name} Smith and my zip code is {r.randint(10000, 99999)}. I need help with an order.",
            f"Please change the shipping address of my pending order {order}.",
            f"What is the status of my {item} order? It has not arrived yet.",
            f"I was charged twice for the {item}, can I get a refund to my gift card?",
            f"The {item} I received is broken. I want a replacement.",
            f"Could you update the payment method on order {order} to my credit card?",
            f"My email is {name.lower()}@example.com, I want to modify the items in my order.",
        ]
    )
    system = (
        "You are a customer service agent for an online retail store. Authenticate the user, then help with "
        "orders, returns and exchanges following the policy. Tools: find_user_id_by_email, get_order_details, "
        "cancel_pending_order, return_delivered_order_items.\n"
    )
    return r.choice(["", system]) + message


def _ifeval(r: random.Random) -> str:
    genre, topic = (
        r.choice(["an essay", "a poem", "a blog post", "a short story", "a letter", "a product description"]),
        r.choice(_TOPICS),
    )
    n = r.randint(2, 6)
    constraint = r.choice(
        [
            f"Your response should contain at least {n} paragraphs separated by ***.",
            "Do not use any commas in your response.",
            "Wrap your entire response in double quotation marks.",
            "Include a title wrapped in double angular brackets, such as <<my title>>.",
            "Your entire response must be in lowercase letters.",
            f"Highlight at least {n} sections with markdown, i.e. *highlighted section*.",
            "Finish your response with the exact phrase 'Any other questions?'.",
            f"Answer with fewer than {n * 50} words.",
            f"The word 'bright' should appear at least {n} times.",
            "Your response must be in French, no other language is allowed.",
            f"Use exactly {n} bullet points in markdown format.",
        ]
    )
    return f"Write {genre} about {topic}. {constraint}"


GENERATORS: dict[str, Callable[[random.Random], str]] = {
    "math": _math,
    "search": _search,
    "retail": _retail,
    "ifeval": _ifeval,
}


def labelled_prompts(
    n_per_tag: int, seed: int = 0, use_demo_records: bool = True, exclude: Collection[str] = ()
) -> list[tuple[str, str]]:
    """``(prompt text, tag)`` pairs: half the env's ``demo_records`` where it has them, the rest generated.

    No text in ``exclude`` is returned (a held-out set excludes the training texts).
    """
    r = random.Random(seed)
    skip = set(exclude)
    out: list[tuple[str, str]] = []
    for tag in TAGS:
        demo = _demo_prompts(tag, n_per_tag // 2, seed) if use_demo_records else []
        texts = [text for text in demo if text not in skip]
        texts += _generated(tag, n_per_tag - len(texts), r, skip)
        out += [(text, tag) for text in texts]
    return out


def _generated(tag: str, n: int, r: random.Random, skip: set[str]) -> list[str]:
    """``n`` prompts from the tag's templates, none in ``skip``; fails loudly if the templates run dry."""
    texts: list[str] = []
    attempts = 0
    while len(texts) < n:
        attempts += 1
        if attempts > 100 * n:
            raise ValueError(f"cannot generate {n} {tag!r} prompts outside the {len(skip)} excluded ones")
        text = GENERATORS[tag](r)
        if text not in skip:
            texts.append(text)
    return texts


def _demo_prompts(tag: str, n: int, seed: int) -> list[str]:
    try:
        records = get_environment(tag).demo_records(n, seed)
    except (UnknownEnvironment, PluginLoadError, NotImplementedError, ValueError):  # absent, unconfigured, no demo data
        return []
    return [text for text in (record_text(rec) for rec in records) if text]


def record_text(record: Mapping[str, Any]) -> str:
    """The words of a slime JSONL record's prompt (a string, or chat messages)."""
    prompt = record.get("prompt")
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, Mapping))
    return str(prompt or "")
