"""Reading an eval dataset (slime JSONL) into tasks, with errors that say which line is wrong."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import JsonlError, iter_jsonl
from aclarena_slime.plugin.contract import Task


class DatasetError(ValueError):
    pass


def read_tasks(
    path: Path, env_tag: str, limit: int | None = None, check_label: Callable[[Any], None] | None = None
) -> list[Task]:
    """The first ``limit`` records of ``path`` as tasks; ``metadata.env`` is set to ``env_tag``.

    A record that names another env in its metadata is an error: the suite and the data disagree. So is a
    label ``check_label`` (the env's :meth:`~aclarena_slime.plugin.contract.Environment.check_label`) refuses.
    """
    if not path.is_file():
        raise DatasetError(f"eval dataset {path} does not exist")
    tasks: list[Task] = []
    try:
        _read_into(tasks, path, env_tag, limit, check_label)
    except JsonlError as exc:
        raise DatasetError(str(exc)) from None
    if not tasks:
        raise DatasetError(f"eval dataset {path} has no records")
    return tasks


def _read_into(
    tasks: list[Task], path: Path, env_tag: str, limit: int | None, check_label: Callable[[Any], None] | None
) -> None:
    for number, record in iter_jsonl(path):
        if limit is not None and len(tasks) >= limit:
            return
        if "prompt" not in record:
            raise DatasetError(f"{path}:{number}: a record is an object with 'prompt', 'label', 'metadata'")
        metadata = record.get("metadata") or {}
        if isinstance(metadata, str):
            try:
                metadata = json.loads(metadata)
            except json.JSONDecodeError:
                raise DatasetError(f"{path}:{number}: metadata is a string but not JSON") from None
        if not isinstance(metadata, dict):
            raise DatasetError(f"{path}:{number}: metadata must be an object")
        if metadata.get("env", env_tag) != env_tag:
            raise DatasetError(f"{path}:{number}: record is for env {metadata['env']!r}, the suite says {env_tag!r}")
        task = Task(prompt=record["prompt"], label=record.get("label"), metadata={**metadata, "env": env_tag})
        if check_label is not None:
            try:
                check_label(task.label_value)
            except ValueError as exc:
                raise DatasetError(f"{path}:{number}: bad label for env {env_tag!r}: {exc}") from None
        tasks.append(task)
