"""The ACLArena authors' retail reward shaping, an option beside τ³'s plain {0, 1} (``shaping`` in the config).

Facts from WillDreamer/ACLArena ``slime/examples/tau-bench/`` (the generate of ``run_qwen3_8B.sh``):

- a success with a malformed assistant turn pays 0.1, a failure pays nothing more
  (``trainable_agents.py:48-49``, applied at ``660-664``);
- a truncated episode (turn limit or response budget) scores -0.2 (``generate_with_tau.py:202-203``);
- an aborted one scores -0.3, "strictly worse than truncation" (``generate_with_tau.py:220-221``). Their agent
  aborts only when SGLang's tool parser raises (a call whose JSON is not an object), the engine or the
  simulator fails (``trainable_agents.py:600-623``): a malformed call, an unknown tool, a thinking-only or an
  empty turn is said to the customer and the episode goes on (``turn_parsing: authors``,
  :mod:`.authors_turns`). Our ``strict`` turn parsing instead ends the episode, scored as aborted, on an
  unreadable call or an empty turn.

A turn is well formed when it is ``[<think>...</think>]<tool_call>...</tool_call>`` (one call) or
``[<think>...</think>]`` plain text without chat or tool markup (``trainable_agents.py:19-39, 62-82``).

A user simulator failing after the greeting: the authors score the sample as aborted, -0.3
(``generate_with_tau.py:205-221``); ``user_failure: -0.3`` does that. With ``user_failure: null`` (the
default) the sample is dropped instead, as an outside-service failure never trained on. A simulator failing
at the greeting always drops it (the env's start aborts): the authors emit a zero-gradient no-op sample with
reward 0.0 there (``generate_with_tau.py:114-174; trainable_agents.py:497-515``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aclarena_slime.plugin.contract import Score
from aclarena_slime.plugin.settings import from_mapping

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MARKUP = (
    CALL_OPEN,
    CALL_CLOSE,
    "<tool_response>",
    "</tool_response>",
    "<|im_start|>",
    "<|im_end|>",
    THINK_OPEN,
    THINK_CLOSE,
)


@dataclass(frozen=True)
class RetailShaping:
    """The shaped values; defaults are the authors' (see the module docstring for script and line)."""

    success_format_penalty: float = 0.1
    failure_format_penalty: float = 0.0
    truncated: float = -0.2
    aborted: float = -0.3
    user_failure: float | None = None  # None: the sample is dropped; a number: its score (the authors' -0.3)

    def __post_init__(self) -> None:
        for name in ("success_format_penalty", "failure_format_penalty", "truncated", "aborted", "user_failure"):
            value = getattr(self, name)
            if name == "user_failure" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -1 <= value <= 1:
                raise ValueError(f"retail env: shaping.{name} must be a number in [-1, 1], got {value!r}")

    @classmethod
    def from_config(cls, value: Mapping[str, Any] | None) -> RetailShaping | None:
        """``None`` (τ³'s plain reward) or a mapping of the values to change (``{}``: the authors')."""
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ValueError(f"retail env: shaping must be a mapping or null, got {value!r}")
        return from_mapping(cls, value, "retail env shaping keys")

    @property
    def reward_range(self) -> tuple[float, float]:
        failure = self.user_failure if self.user_failure is not None else 0.0
        low = min(
            0.0, self.truncated, self.aborted, failure, -self.failure_format_penalty, 1.0 - self.success_format_penalty
        )
        return low, 1.0

    def shape(self, score: Score, *, aborted: bool, truncated: bool, bad_turns: int) -> Score:
        """The shaped score: the τ³ outcome stays in the breakdown as ``task_reward``."""
        task_reward = score.reward
        if aborted:
            reward = self.aborted
        elif truncated:
            reward = self.truncated
        elif bad_turns:
            reward = task_reward - (self.success_format_penalty if task_reward > 0 else self.failure_format_penalty)
        else:
            reward = task_reward
        breakdown = {**score.breakdown, "task_reward": task_reward, "format_bad_turns": bad_turns}
        return Score(reward, breakdown)


def turn_well_formed(text: str) -> bool:
    """The authors' per-turn format rule (see the module docstring); linear in the turn's length."""
    if not text:
        return False
    rest = text
    head = text.lstrip()
    if head.startswith(THINK_OPEN):
        inside = head[len(THINK_OPEN) :]
        close = inside.find(THINK_CLOSE)
        if close < 0 or THINK_OPEN in inside:  # unclosed, or a second <think>
            return False
        rest = inside[close + len(THINK_CLOSE) :]
    action = rest.strip()
    if action.startswith(CALL_OPEN) and action.endswith(CALL_CLOSE) and action.count(CALL_OPEN) == 1:
        return True
    return not any(mark in rest for mark in MARKUP)
