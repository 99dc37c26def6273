"""reasoning-gym records: a weighted mix of its generators, their gold answers, ``aclarena data prepare reasoning_gym``.

A record is slime JSONL whose metadata names where the generator made it (``task``, ``config``,
``seed``, ``size``, ``item``): the env regenerates that exact entry to score an answer, so tasks whose
``score_answer`` reads the entry's metadata (a puzzle's grid, an equation's roots) score as the library
does, and a record stays a few hundred bytes. The same tasks, weights and seed give the same records.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import write_jsonl_atomic

TAG = "reasoning_gym"
ANSWER_TAG = "answer"
EXTRA = "pip install -e '.[reasoning-gym]'"


def library() -> Any:
    """The ``reasoning_gym`` module, or an error that names the extra to install."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(f"the reasoning_gym env needs the reasoning-gym package: {EXTRA}") from exc
    return reasoning_gym


def weights_of(tasks: str | Mapping[str, float] | list[str]) -> dict[str, float]:
    """``"name"``, ``["a", "b"]`` (equal weights) or ``{"a": 2, "b": 1}`` as checked weights by task name."""
    if isinstance(tasks, str):
        tasks = {tasks: 1.0}
    elif not isinstance(tasks, Mapping):
        tasks = {str(name): 1.0 for name in tasks}
    weights = {str(k): float(v) for k, v in tasks.items()}
    if not weights or any(not w > 0 for w in weights.values()):
        raise ValueError(f"reasoning_gym: tasks need at least one task and positive weights, got {dict(tasks)}")
    known = set(library().factory.DATASETS)
    unknown = sorted(set(weights) - known)
    if unknown:
        raise ValueError(f"reasoning_gym: unknown task(s) {unknown}; reasoning-gym has {len(known)}, e.g. {sorted(known)[:8]}")
    return weights


def dataset(task: str, seed: int, size: int, config: Mapping[str, Any] | None = None) -> Any:
    """The generator's dataset (``reasoning_gym.create_dataset``) for a record ``seed``.

    reasoning-gym draws entry ``k`` at ``seed + k``, so seeds ``s`` and ``s + 1`` would give one sequence shifted by an
    entry (and a held-out seed 10,007 the 10,007th training entry on): the generator gets a seed hashed from the
    record seed and the task, and seeds draw apart (below 2**31: some tasks seed numpy with it plus the entry, which
    must stay below 2**32)."""
    digest = hashlib.blake2b(f"{task}:{seed}".encode(), digest_size=4).digest()
    return library().create_dataset(task, size=size, seed=int.from_bytes(digest, "big") >> 1, **dict(config or {}))


def records(
    tasks: str | Mapping[str, float] | list[str],
    n: int,
    seed: int = 0,
    task_config: Mapping[str, Mapping[str, Any]] | None = None,
    tag: str = TAG,
) -> list[dict[str, Any]]:
    """``n`` records drawn from ``tasks`` by weight; each task's entries come from its own generator at ``seed``;
    ``metadata.env`` is ``tag`` (a variant's, e.g. ``reasoning_gym-spell_backward``, for a domain of its own)."""
    weights = weights_of(tasks)
    task_config = dict(task_config or {})
    names = sorted(weights)
    rng = random.Random(seed)
    picks = rng.choices(names, [weights[name] for name in names], k=n)
    sizes = Counter(picks)
    made = {name: dataset(name, seed, sizes[name], task_config.get(name)) for name in sizes}
    taken: Counter[str] = Counter()
    out = []
    for i, name in enumerate(picks):
        item = taken[name]
        taken[name] += 1
        entry = made[name][item]
        metadata = {"env": tag, "index": i, "task": name, "seed": seed, "size": sizes[name], "item": item}
        if task_config.get(name):
            metadata["config"] = dict(task_config[name])
        out.append({"prompt": str(entry["question"]), "label": str(entry["answer"]), "metadata": metadata})
    return out


def demo_turns(record: dict[str, Any]) -> list[str]:
    """The gold turn of a record: the generator's answer in the env's answer tags (the SFT warm start)."""
    return [f"<{ANSWER_TAG}>{record.get('label', '')}</{ANSWER_TAG}>"]


def _task_weight(text: str) -> tuple[str, float]:
    name, _, weight = text.partition(":")
    return name, float(weight) if weight else 1.0


def main(argv: list[str], tag: str = TAG) -> int:
    """``aclarena data prepare reasoning_gym --output FILE --task NAME[:WEIGHT] ... [--n N] [--seed S]``; under a
    variant tag (``aclarena data prepare reasoning_gym-NAME ...``) the records carry that tag."""
    parser = argparse.ArgumentParser(prog=f"aclarena data prepare {tag}", description=main.__doc__)
    parser.add_argument("--output", type=Path, required=True, help="slime JSONL to write")
    parser.add_argument("--task", action="append", required=True, help="a reasoning-gym task, NAME or NAME:WEIGHT")
    parser.add_argument("--n", type=int, default=1000, help="records to write")
    parser.add_argument("--seed", type=int, default=0, help="another seed gives other entries (an eval set)")
    args = parser.parse_args(argv)
    weights = dict(_task_weight(t) for t in args.task)
    written = write_jsonl_atomic(records(weights, args.n, args.seed, tag=tag), args.output)
    print(json.dumps({"written": written, "output": str(args.output), "tasks": weights}))
    return 0
