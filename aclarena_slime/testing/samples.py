"""A duck-typed stand-in for slime's ``Sample`` and ``args``, for tests that run without slime."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from types import SimpleNamespace
from typing import Any


@dataclass
class FakeSample:
    """The fields of ``slime.utils.types.Sample`` that a generate/reward function touches."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
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
    metadata: dict = field(default_factory=dict)


def make_args(hf_checkpoint: str, host: str, port: int, **overrides: Any) -> SimpleNamespace:
    """A namespace with the slime arguments our rollout reads."""
    args = SimpleNamespace(
        hf_checkpoint=str(hf_checkpoint),
        sglang_router_ip=host,
        sglang_router_port=port,
        rollout_max_response_len=256,
        aclarena_env_config={},
        aclarena_experts=None,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def check_invariants(sample: Any) -> None:
    """The token-level invariants every generated sample must satisfy (raises AssertionError)."""
    n = sample.response_length
    assert len(sample.loss_mask) == n, f"loss_mask has {len(sample.loss_mask)} entries, response_length is {n}"
    assert len(sample.rollout_log_probs) == n, f"{len(sample.rollout_log_probs)} log-probs for {n} response tokens"
    assert n <= len(sample.tokens), "response longer than the token list"
    assert all(m in (0, 1) for m in sample.loss_mask)
