"""What every IFEval checker is: an id, declared kwargs, a verdict on a response, a way to be sampled.

A checker is built from one ``kwargs`` dict of a label. Kwargs are validated when it is built, so a bad
label fails at once with a message naming the instruction — never at scoring time, and never by
drawing a random default as the reference implementation does for missing kwargs.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

#: The two comparisons IFEval's counting instructions use.
RELATIONS = ("less than", "at least")


class LabelError(ValueError):
    """A label (instruction ids and kwargs) that cannot be checked: unknown id, missing or bad kwarg."""


@dataclass(frozen=True)
class Param:
    """One kwarg of an instruction: its type and the values it may take."""

    name: str
    kind: type  # int, str or list (a list of strings)
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    required: bool = True

    def coerce(self, instruction_id: str, value: Any) -> Any:
        where = f"{instruction_id}: kwarg {self.name!r}"
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise LabelError(f"{where} must be an integer, got {value!r}")
            try:
                number = int(value)
            except (ValueError, OverflowError):
                raise LabelError(f"{where} must be an integer, got {value!r}") from None
            if number != float(value):
                raise LabelError(f"{where} must be a whole number, got {value!r}")
            if self.minimum is not None and number < self.minimum:
                raise LabelError(f"{where} must be at least {self.minimum}, got {number}")
            return number
        if self.kind is list:
            if isinstance(value, str) or not isinstance(value, list | tuple):
                raise LabelError(f"{where} must be a list of strings, got {value!r}")
            if not value or not all(isinstance(item, str) and item.strip() for item in value):
                raise LabelError(f"{where} must be a non-empty list of non-empty strings, got {value!r}")
            return [item.strip() for item in value]
        if not isinstance(value, str) or not value.strip():
            raise LabelError(f"{where} must be a non-empty string, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise LabelError(f"{where} must be one of {list(self.choices)}, got {value!r}")
        return value


class Checker(ABC):
    """One verifiable instruction with its kwargs bound."""

    id: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()

    def __init__(self, kwargs: Mapping[str, Any] | None = None) -> None:
        given = {key: value for key, value in dict(kwargs or {}).items() if value is not None}
        known = {param.name for param in self.params}
        unknown = sorted(set(given) - known)
        if unknown:
            raise LabelError(f"{self.id}: unknown kwargs {unknown}; it takes {sorted(known) or 'none'}")
        self.kwargs: dict[str, Any] = {}
        for param in self.params:
            if param.name in given:
                self.kwargs[param.name] = param.coerce(self.id, given[param.name])
            elif param.required:
                raise LabelError(f"{self.id}: missing kwarg {param.name!r}")
        self._validate()

    def _validate(self) -> None:  # noqa: B027 - optional hook, most checkers have nothing to add
        """Cross-kwarg checks (e.g. the nth paragraph exists); raise LabelError."""

    @abstractmethod
    def check(self, response: str) -> bool:
        """Whether ``response`` follows the instruction (the reference's ``check_following``)."""

    @abstractmethod
    def describe(self) -> str:
        """The instruction as a sentence for a prompt."""

    @classmethod
    @abstractmethod
    def sample_kwargs(cls, rng: random.Random) -> dict[str, Any]:
        """Kwargs for a generated prompt, drawn from ``rng``."""


_REGISTRY: dict[str, type[Checker]] = {}


def register(instruction_id: str) -> Callable[[type[Checker]], type[Checker]]:
    """Class decorator: file a checker under its IFEval instruction id."""

    def wrap(cls: type[Checker]) -> type[Checker]:
        if instruction_id in _REGISTRY:
            raise RuntimeError(f"instruction id {instruction_id!r} registered twice")
        cls.id = instruction_id
        _REGISTRY[instruction_id] = cls
        return cls

    return wrap


def compare(count: int, relation: str, threshold: int) -> bool:
    """IFEval's two relations: ``less than`` is strict, ``at least`` is inclusive."""
    return count < threshold if relation == RELATIONS[0] else count >= threshold
