"""OpenEnv records: one per episode, the server's ``reset`` arguments in ``metadata.reset``; ``aclarena data prepare openenv``.

An OpenEnv server makes its own tasks at ``reset``; a record only says which episode to ask for (``seed``, which
the server passes to its env's ``reset`` when that takes one) and names it in its prompt ("Episode 7."), which
follows the env's ``instruction`` (a record of your own may put the task there instead). Distinct prompts keep
the local backend's held-out episodes out of training. The same seed gives the same records.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import write_jsonl_atomic

TAG = "openenv"


def records(n: int, seed: int = 0, tag: str = TAG) -> list[dict[str, Any]]:
    """``n`` records asking for the episodes ``reset(seed=...)`` of seeds derived from ``seed``."""
    seeds = [seed * 1_000_003 + i for i in range(n)]
    return [{"prompt": f"Episode {s}.", "label": None, "metadata": {"env": tag, "index": i, "reset": {"seed": s}}}
            for i, s in enumerate(seeds)]  # fmt: skip


def main(argv: list[str]) -> int:
    """``aclarena data prepare openenv --output FILE [--n N] [--seed S]``: one record per episode to ask for."""
    parser = argparse.ArgumentParser(prog="aclarena data prepare openenv", description=main.__doc__)
    parser.add_argument("--output", type=Path, required=True, help="slime JSONL to write")
    parser.add_argument("--n", type=int, default=1000, help="records to write")
    parser.add_argument("--seed", type=int, default=0, help="another seed asks for other episodes (an eval set)")
    args = parser.parse_args(argv)
    written = write_jsonl_atomic(records(args.n, args.seed), args.output)
    print(json.dumps({"written": written, "output": str(args.output)}))
    return 0
