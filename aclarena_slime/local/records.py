"""Dataset records for a local stage, and the slime-shaped ``Sample`` the rollout functions fill.

Records are slime JSONL (``prompt``, ``label``, ``metadata.env``) read from a file, or the env's
generated ``demo_records`` when no file is named (no downloads).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from aclarena_slime.contract import Environment
from aclarena_slime.jsonl import JsonlError, iter_jsonl


class RecordError(ValueError):
    """Records that cannot feed the stage; the message names the file and line."""


@dataclass
class Sample:
    """The fields of slime's ``Sample`` that :mod:`aclarena_slime.rollout` reads and writes."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Whether the sample may be trained on or counted (an aborted env service never is)."""
        return not self.remove_sample and self.status not in (Sample.Status.ABORTED, Sample.Status.FAILED)


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
