"""Scoring one response against one label: per-instruction verdicts, strict and loose, and the reward.

A label is ``{"instruction_id_list": [...], "kwargs": [...]}`` (a dict, or that dict as JSON). Strict
checks the response as written. Loose, IFEval's upper bound, also accepts the response with its first
line, its last line or both removed, each with and without markdown asterisks — eight variants, any of
which may pass. An empty response follows nothing. Thinking (``<think>…</think>``) is removed before
anything is checked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from aclarena_envs.ifeval.checkers import Checker, LabelError, build_checker

LEVELS: tuple[str, ...] = ("prompt", "instruction")
MODES: tuple[str, ...] = ("strict", "loose")

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Label:
    """The instructions of one prompt, validated: ids and their kwargs, position by position."""

    instruction_ids: tuple[str, ...]
    kwargs: tuple[dict[str, Any], ...]

    @classmethod
    def parse(cls, value: Any) -> Label:
        """From a dict or its JSON text; LabelError says what is wrong."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise LabelError(f"label is not JSON: {exc}") from None
        if not isinstance(value, Mapping):
            raise LabelError(f"label must be an object with instruction_id_list and kwargs, got {value!r:.200}")
        ids = value.get("instruction_id_list")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise LabelError("label.instruction_id_list must be a non-empty list of instruction ids")
        kwargs = value.get("kwargs", [{} for _ in ids])
        if not isinstance(kwargs, list) or len(kwargs) != len(ids):
            raise LabelError(f"label.kwargs must be a list with one object per instruction ({len(ids)})")
        if not all(k is None or isinstance(k, Mapping) for k in kwargs):
            raise LabelError("label.kwargs entries must be objects (or null)")
        return cls(tuple(ids), tuple(dict(k or {}) for k in kwargs))

    def to_json(self) -> str:
        return json.dumps({"instruction_id_list": list(self.instruction_ids), "kwargs": list(self.kwargs)})

    def checkers(self) -> tuple[Checker, ...]:
        """Built checkers; cached per label so a training run compiles each label's patterns once."""
        return _checkers(json.dumps([self.instruction_ids, self.kwargs], sort_keys=True, default=repr))


@lru_cache(maxsize=4096)
def _checkers(key: str) -> tuple[Checker, ...]:
    ids, kwargs = json.loads(key)
    return tuple(build_checker(i, k) for i, k in zip(ids, kwargs, strict=True))


def strip_thinking(response: str) -> tuple[str, bool]:
    """The answer without its thinking, and whether thinking was there.

    The answer is what follows the last ``</think>``; an unclosed ``<think>`` leaves only what came
    before it (a truncated thought has no answer).
    """
    if _THINK_CLOSE in response:
        return response.rsplit(_THINK_CLOSE, 1)[1].strip(), True
    if _THINK_OPEN in response:
        return response.split(_THINK_OPEN, 1)[0].strip(), True
    return response, False


def loose_variants(response: str) -> list[str]:
    """IFEval's eight loose readings of a response, the response itself first."""
    lines = response.split("\n")
    without_first = "\n".join(lines[1:]).strip()
    without_last = "\n".join(lines[:-1]).strip()
    without_both = "\n".join(lines[1:-1]).strip()
    plain = [response, without_first, without_last, without_both]
    return [plain[0], plain[0].replace("*", "")] + plain[1:] + [v.replace("*", "") for v in plain[1:]]


def follows(checker: Checker, response: str) -> bool:
    """Strict verdict: a blank response follows nothing."""
    return bool(response.strip()) and checker.check(response)


def follows_loosely(checker: Checker, variants: Sequence[str]) -> bool:
    return any(follows(checker, variant) for variant in variants)


@dataclass(frozen=True)
class Verdicts:
    """Per-instruction results of one response, strict and loose."""

    instruction_ids: tuple[str, ...]
    strict: tuple[bool, ...]
    loose: tuple[bool, ...]

    def followed(self, mode: str) -> tuple[bool, ...]:
        return self.strict if mode == "strict" else self.loose

    def reward(self, level: str, mode: str) -> float:
        followed = self.followed(mode)
        if level == "prompt":
            return float(all(followed))
        return sum(followed) / len(followed)

    def breakdown(self) -> dict[str, Any]:
        return {
            "prompt_strict": all(self.strict),
            "prompt_loose": all(self.loose),
            "instruction_strict": sum(self.strict) / len(self.strict),
            "instruction_loose": sum(self.loose) / len(self.loose),
            "instructions": [
                {"id": i, "strict": s, "loose": lo}
                for i, s, lo in zip(self.instruction_ids, self.strict, self.loose, strict=True)
            ],
        }


def judge(label: Label, response: str) -> Verdicts:
    """Check every instruction of ``label`` on ``response`` (thinking already removed)."""
    checkers = label.checkers()
    strict = tuple(follows(checker, response) for checker in checkers)
    variants: list[str] | None = None
    loose = []
    for checker, ok in zip(checkers, strict, strict=True):
        if not ok:  # strict success is the first loose variant; only failures need the others
            variants = variants if variants is not None else loose_variants(response)
            ok = follows_loosely(checker, variants[1:])
        loose.append(ok)
    return Verdicts(label.instruction_ids, strict, tuple(loose))
