"""A slime-shaped ``Sample`` for places that run our rollout functions without slime.

The local backend trains on it, and tests use it as slime's stand-in: the fields are those of
``slime.utils.types.Sample`` that :mod:`aclarena_slime.rollout` and the distillation plugins read
and write, with the same names, types and status values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
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
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    teacher_log_probs: list[float] | None = None
    remove_sample: bool = False
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        """Whether the sample may be trained on or counted (an aborted env service never is)."""
        return not self.remove_sample and self.status not in (Sample.Status.ABORTED, Sample.Status.FAILED)
