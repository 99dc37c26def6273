"""The template env's data: generated demo records, their gold turns, and ``aclarena data prepare template``.

A record is slime JSONL: ``{"prompt": ..., "label": ..., "metadata": {"env": TAG, ...}}``. Here the
task is to repeat a made-up word; the words come from syllables, so thousands of distinct prompts
exist and the local backend's held-out evaluation never sees a training prompt. Replace the
generator with your own data (or keep it for smoke runs and read real data in ``main``).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import write_jsonl_atomic

TAG = "template"
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def demo_records(n: int, seed: int = 0, tag: str = TAG) -> list[dict[str, Any]]:
    """``n`` records "Repeat this word: W.", label W, reproducible from ``seed``."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
        records.append({"prompt": f"Repeat this word: {word}.", "label": word, "metadata": {"env": tag, "index": i}})
    return records


def demo_turns(record: dict[str, Any]) -> list[str]:
    """The gold model turns of a record (here: the word): the local backend's SFT warm start replays them."""
    return [str(record.get("label", ""))]


def main(argv: list[str]) -> int:
    """``aclarena data prepare template --output FILE [--n N] [--seed S]``: demo records as slime JSONL."""
    parser = argparse.ArgumentParser(prog="aclarena data prepare template", description=main.__doc__)
    parser.add_argument("--output", type=Path, required=True, help="slime JSONL to write")
    parser.add_argument("--n", type=int, default=1000, help="records to write")
    parser.add_argument("--seed", type=int, default=0, help="another seed gives other words (an eval set)")
    args = parser.parse_args(argv)
    written = write_jsonl_atomic(demo_records(args.n, args.seed), args.output)
    print(json.dumps({"written": written, "output": str(args.output)}))
    return 0
