"""The registry of IFEval instruction ids: id → checker class, one module per instruction family.

Building a checker for an id that is not here raises :class:`LabelError`: an instruction we cannot
verify is never skipped (skipping would hand out reward for nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from aclarena_envs.ifeval.checkers import case_language, formats, keywords, length, startend  # noqa: F401 - register
from aclarena_envs.ifeval.checkers.base import _REGISTRY, RELATIONS, Checker, LabelError, Param

#: Every supported instruction id and its checker class (IFEval's 25).
INSTRUCTIONS: Mapping[str, type[Checker]] = MappingProxyType(_REGISTRY)


def build_checker(instruction_id: str, kwargs: Mapping[str, Any] | None = None) -> Checker:
    """The checker for one instruction of a label; LabelError for an unknown id or bad kwargs."""
    try:
        cls = INSTRUCTIONS[instruction_id]
    except (KeyError, TypeError):
        raise LabelError(
            f"unknown IFEval instruction id {instruction_id!r}; known ids: {', '.join(sorted(INSTRUCTIONS))}"
        ) from None
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise LabelError(f"{instruction_id}: kwargs must be an object, got {kwargs!r}")
    return cls(kwargs)


__all__ = ["INSTRUCTIONS", "RELATIONS", "Checker", "LabelError", "Param", "build_checker"]
