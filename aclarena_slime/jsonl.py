"""JSON and JSON-lines files, read with errors that name the file and line, written atomically.

Every dataset, rollout dump and result file of the project is JSONL, and every manifest, summary and
metrics file is JSON; reading and writing them goes through here so that a bad line always says
where it is, and an interrupted write never leaves a truncated file where a good one was.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


class JsonlError(ValueError):
    """A line that is not a JSON object; the message starts with ``file:line``."""


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line."""
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise JsonlError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise JsonlError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
            yield number, record


def write_jsonl_atomic(records: Iterable[dict[str, Any]], output: str | Path) -> int:
    """Write ``records`` one per line through a temporary file; returns how many were written."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(output)
    n = 0
    try:
        with tmp.open("x", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                n += 1
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(output)
    return n


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write one JSON document through a synced temporary file: a reader sees the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(path)
    try:
        with tmp.open("x", encoding="utf-8") as f:
            json.dump(data, f, indent=2, ensure_ascii=False, default=str)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _temp_name(path: Path) -> Path:
    """A temporary file beside ``path`` that no other writer uses: two writers of one file (two processes, two
    threads) each rename their own whole file into place, the last one wins, neither renames the other's."""
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")
