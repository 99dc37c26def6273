"""Tool schemas and argument checks derived from a method's signature and docstring, written once.

A tool method is annotated with ``str`` or ``list[str]`` parameters and documents them in a
Google-style ``Args:`` section. From that we build the OpenAI function schema the chat template
shows the model, and we check a call's arguments against it before the tool runs, so a bad call is
refused as a whole and never half-applied.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

_TOOL_ATTR = "__retail_tool__"
_SECTION = re.compile(r"^\s*(Args|Returns|Raises):\s*$")


def tool(*, writes: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a method as a tool; ``writes`` says whether it may change the database."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, _TOOL_ATTR, writes)
        return fn

    return mark


def is_tool(fn: Any) -> bool:
    return hasattr(fn, _TOOL_ATTR)


class ArgumentError(ValueError):
    """The model's arguments do not fit the tool's signature."""


_JSON_TYPES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    list[str]: {"type": "array", "items": {"type": "string"}},
}


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (text before the first section) and the ``Args:`` entries of a docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, list[str]] = {}
    section, current = None, None
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, current = header.group(1), None
            continue
        if section is None:
            description.append(line.strip())
        elif section == "Args" and line.strip():
            entry = re.match(r"^    (\w+):\s*(.*)$", line)
            if entry:
                current = entry.group(1)
                args[current] = [entry.group(2)]
            elif current is not None:
                args[current].append(line.strip())
    paragraphs = " ".join(line for line in description if line)
    return paragraphs, {k: " ".join(v).strip() for k, v in args.items()}


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, whether it writes, its parameters and their JSON types."""

    name: str
    writes: bool
    description: str
    params: dict[str, Any]  # parameter name -> annotation (str or list[str])
    param_docs: dict[str, str]

    @classmethod
    def from_method(cls, fn: Callable[..., Any]) -> ToolSpec:
        if not fn.__doc__:
            raise TypeError(f"tool {fn.__name__} needs a docstring: it is the description the model sees")
        description, docs = _parse_docstring(fn.__doc__)
        hints = typing.get_type_hints(fn)
        params = {}
        for name in inspect.signature(fn).parameters:
            if name == "self":
                continue
            if hints.get(name) not in _JSON_TYPES:
                raise TypeError(f"tool {fn.__name__}: parameter {name} must be annotated str or list[str]")
            if name not in docs:
                raise TypeError(f"tool {fn.__name__}: parameter {name} is not documented under Args:")
            params[name] = hints[name]
        return cls(fn.__name__, getattr(fn, _TOOL_ATTR), description, params, docs)

    def openai_schema(self) -> dict[str, Any]:
        """The OpenAI function-calling schema (what chat templates render under ``tools``)."""
        properties = {
            name: {**_JSON_TYPES[anno], "description": self.param_docs[name]} for name, anno in self.params.items()
        }
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "properties": properties, "required": list(self.params)},
            },
        }

    def check(self, arguments: Mapping[str, Any]) -> None:
        """Raise ``ArgumentError`` unless ``arguments`` has exactly the parameters, with the right types."""
        extra = [k for k in arguments if k not in self.params]
        if extra:
            raise ArgumentError(f"{self.name} got unexpected argument(s) {', '.join(map(repr, extra))}")
        missing = [k for k in self.params if k not in arguments]
        if missing:
            raise ArgumentError(f"{self.name} is missing argument(s) {', '.join(map(repr, missing))}")
        for name, anno in self.params.items():
            value = arguments[name]
            ok = (
                isinstance(value, str)
                if anno is str
                else isinstance(value, list) and all(isinstance(v, str) for v in value)
            )
            if not ok:
                expected = "a string" if anno is str else "a list of strings"
                raise ArgumentError(f"{self.name}: argument {name!r} must be {expected}, got {value!r}"[:300])
