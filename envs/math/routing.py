"""Math requests as a client of the router writes them (AIME-style problems), for its tag classifier.

The demo records are two-operand sums only; these add the phrasing of competition problems, so the
classifier does not learn "math" from one template.
"""

from __future__ import annotations

import random


def prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` AIME-like problems, reproducible from ``seed`` (the templates repeat: expect duplicates)."""
    r = random.Random(seed)
    return [_problem(r) for _ in range(n)]


def _problem(r: random.Random) -> str:
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
