"""Dataset records for a local stage, turned into the slime-shaped samples the rollout functions fill.

Records are slime JSONL (``prompt``, ``label``, ``metadata.env``) read from a file, or the env's
generated ``demo_records`` when no file is named (no downloads).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import JsonlError, iter_jsonl
from aclarena_slime.plugin.contract import Environment
from aclarena_slime.sample import Sample


class RecordError(ValueError):
    """Records that cannot feed the stage; the message names the file and line."""


def read_jsonl(path: str | Path, tag: str) -> list[dict[str, Any]]:
    """Records of ``path``; each gets ``metadata.env = tag`` when it has none, and a mismatch is an error."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"data file {path} does not exist")
    try:
        records = [_checked(record, tag, f"{path}:{n}") for n, record in iter_jsonl(path)]
    except JsonlError as exc:
        raise RecordError(str(exc)) from None
    if not records:
        raise RecordError(f"data file {path} holds no records")
    return records


def demo_records(env: Environment, n: int, seed: int) -> list[dict[str, Any]]:
    try:
        records = env.demo_records(n, seed=seed)
    except NotImplementedError as exc:
        raise RecordError(f"{exc}; set data_path (and eval_data_path) for the local stage") from exc
    return [_checked(r, env.tag, f"demo record {i}") for i, r in enumerate(records)]


def _checked(record: Any, tag: str, where: str) -> dict[str, Any]:
    if not isinstance(record, dict) or "prompt" not in record:
        raise RecordError(f"{where}: a record must be an object with a 'prompt'")
    metadata = dict(record.get("metadata") or {})
    if metadata.setdefault("env", tag) != tag:
        raise RecordError(f"{where}: record is for env {metadata['env']!r}, but this stage trains {tag!r}")
    return {**record, "metadata": metadata}


def take(records: list[dict[str, Any]], n: int, rng: random.Random) -> list[dict[str, Any]]:
    """``n`` records, reshuffled on every pass through ``records`` (a seeded epoch order)."""
    out: list[dict[str, Any]] = []
    while len(out) < n:
        order = list(records)
        rng.shuffle(order)
        out += order[: n - len(out)]
    return out


def new_sample(record: dict[str, Any], group: int, index: int) -> Sample:
    return Sample(
        group_index=group,
        index=index,
        prompt=record["prompt"],
        label=record.get("label"),
        metadata=json.loads(json.dumps(record["metadata"])),  # a private copy: the rollout writes into it
    )
