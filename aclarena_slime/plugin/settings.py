"""Building a settings dataclass from a plain mapping (a recipe section), strictly.

A misspelt key in a recipe must fail loudly and say what the known keys are, never be dropped:
every settings dataclass of the project is built through :func:`from_mapping`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def from_mapping(cls: type[T], values: Mapping[str, Any], what: str, error: type[Exception] = ValueError) -> T:
    """``cls(**values)``, after refusing keys ``cls`` has no field for (``what`` names the settings)."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise error(f"unknown {what} {unknown}; known: {sorted(known)}")
    return cls(**dict(values))
