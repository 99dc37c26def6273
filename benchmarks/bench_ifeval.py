"""IFEval checker throughput on generated prompts and synthetic responses.

    .venv/bin/python benchmarks/bench_ifeval.py [--prompts 500] [--seed 0]

Prints a table: instruction checks per second for strict checking alone and for the env's full
scoring (strict and loose, as every score breakdown carries both), plus the slowest instruction ids.
Responses mix the shapes the checkers look for (titles, bullets, dividers, JSON, capitals, quotes),
so both passing and failing paths run.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from aclarena_envs.ifeval import text
from aclarena_envs.ifeval.generator import generate
from aclarena_envs.ifeval.reward import follows, judge
from aclarena_envs.ifeval.vocabulary import WORDS

_SHAPES = ("plain", "title", "bullets", "divided", "paragraphs", "json", "upper", "lower", "quoted", "two", "ps")


def _sentence(rng: random.Random) -> str:
    words = rng.sample(WORDS, k=rng.randint(5, 14))
    if rng.random() < 0.3:
        words.insert(rng.randrange(len(words)), rng.choice(WORDS).upper())
    text = " ".join(words)
    if rng.random() < 0.3:
        text = text.replace(" ", ", ", 1)
    return text[0].upper() + text[1:] + rng.choice(".!?")


def synthetic_response(rng: random.Random) -> str:
    """A response of 2–12 sentences in one of several layouts."""
    body = [_sentence(rng) for _ in range(rng.randint(2, 12))]
    shape = rng.choice(_SHAPES)
    if shape == "title":
        return f"<<{rng.choice(WORDS).title()}>>\n" + " ".join(body)
    if shape == "bullets":
        return "Here are the points:\n" + "\n".join(f"* {s}" for s in body)
    if shape == "divided":
        return "\n***\n".join(body)
    if shape == "paragraphs":
        return "\n\n".join(body)
    if shape == "json":
        return "```json\n" + json.dumps({"answer": body}) + "\n```"
    if shape == "upper":
        return " ".join(body).upper()
    if shape == "lower":
        return " ".join(body).lower()
    if shape == "quoted":
        return '"' + " ".join(body) + '"'
    if shape == "two":
        return " ".join(body[: len(body) // 2]) + "\n******\n" + " ".join(body[len(body) // 2 :])
    if shape == "ps":
        return " ".join(body) + "\n\nP.S. " + _sentence(rng)
    return " ".join(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    prompts = list(generate(args.prompts, args.seed, max_instructions=4))
    responses = [synthetic_response(rng) for _ in prompts]
    pairs = [(p.label, r) for p, r in zip(prompts, responses, strict=True)]
    for label, _ in pairs:  # build (and cache) checkers outside the timed loops, as a training run does
        label.checkers()
    judge(pairs[0][0], "warm up language detection and Punkt")

    checks, per_id_time, per_id_count = 0, defaultdict(float), defaultdict(int)
    start = time.perf_counter()
    for label, response in pairs:
        for checker in label.checkers():
            t0 = time.perf_counter()
            follows(checker, response)
            per_id_time[checker.id] += time.perf_counter() - t0
            per_id_count[checker.id] += 1
            checks += 1
    strict_s = time.perf_counter() - start

    text.detect_language.cache_clear()  # the full run must not reuse the strict run's detections
    start = time.perf_counter()
    passed = sum(sum(judge(label, response).strict) for label, response in pairs)
    full_s = time.perf_counter() - start

    table = Table(title=f"IFEval checks: {len(pairs)} generated prompts, {checks} instructions (seed {args.seed})")
    for column in ("what", "seconds", "checks/s", "prompts/s"):
        table.add_column(column, justify="right" if column != "what" else "left")
    table.add_row("strict only", f"{strict_s:.3f}", f"{checks / strict_s:,.0f}", f"{len(pairs) / strict_s:,.0f}")
    table.add_row(
        "strict + loose (env score)", f"{full_s:.3f}", f"{checks / full_s:,.0f}", f"{len(pairs) / full_s:,.0f}"
    )
    console = Console()
    console.print(table)
    console.print(f"instructions followed (strict): {passed}/{checks}")

    slow = Table(title="slowest instruction ids (strict, mean per check)")
    slow.add_column("instruction id")
    slow.add_column("checks", justify="right")
    slow.add_column("µs/check", justify="right")
    ranked = sorted(per_id_time, key=lambda i: per_id_time[i] / per_id_count[i], reverse=True)
    for instruction_id in ranked[:6]:
        mean_us = 1e6 * per_id_time[instruction_id] / per_id_count[instruction_id]
        slow.add_row(instruction_id, str(per_id_count[instruction_id]), f"{mean_us:,.0f}")
    console.print(slow)


if __name__ == "__main__":
    main()
