"""The τ³-Retail data directory (``db.json``, ``tasks.json``, ``split_tasks.json``, ``policy.md``) and
the slime task records made from it.

The data is the user's: we read the directory they name and never ship or download it. A record
carries only the task id and split (``metadata.env = "retail"``); the environment looks the task up
in the same directory, so records stay small and one copy of the tasks is the truth.

Command line (``aclarena data prepare retail ...`` calls :func:`main`)::

    aclarena data prepare retail --data ~/tau3/retail --split train --out data/retail_train.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aclarena_envs.retail.db import RetailDatabase
from aclarena_slime.jsonl import write_jsonl_atomic

TAG = "retail"
SPLITS = ("base", "train", "test")


class DataDirError(ValueError):
    """The data directory is missing a file or holds something unexpected; the message says which."""


def _read_json(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError as exc:
        raise DataDirError(f"{path.name} not found in {path.parent} (is this a τ³-Retail data directory?)") from exc
    except json.JSONDecodeError as exc:
        raise DataDirError(f"{path} is not valid JSON: {exc}") from exc


@dataclass(frozen=True)
class RetailData:
    """Everything read from one data directory."""

    root: Path
    db: RetailDatabase
    tasks: dict[str, dict[str, Any]]  # task id -> τ³ task record
    splits: dict[str, list[str]]  # split name -> task ids
    policy: str

    @classmethod
    def load(cls, root: str | Path) -> RetailData:
        root = Path(root).expanduser()
        if not root.is_dir():
            raise DataDirError(f"retail data directory {root} does not exist")
        raw_tasks = _read_json(root / "tasks.json")
        if not isinstance(raw_tasks, list) or not all(isinstance(t, dict) and "id" in t for t in raw_tasks):
            raise DataDirError(f"{root / 'tasks.json'}: expected a list of task objects with an 'id'")
        tasks = {str(t["id"]): t for t in raw_tasks}
        splits = _read_json(root / "split_tasks.json")
        if not isinstance(splits, dict):
            raise DataDirError(f"{root / 'split_tasks.json'}: expected an object of split name -> task ids")
        splits = {str(k): [str(i) for i in v] for k, v in splits.items()}
        for name, ids in splits.items():
            unknown = [i for i in ids if i not in tasks]
            if unknown:
                raise DataDirError(f"split {name!r} names tasks missing from tasks.json: {unknown[:5]}")
        try:
            policy = (root / "policy.md").read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise DataDirError(f"policy.md not found in {root}") from exc
        return cls(root, RetailDatabase.load(root / "db.json"), tasks, splits, policy)

    def split(self, name: str) -> list[dict[str, Any]]:
        """The tasks of a split, in the split file's order."""
        if name not in self.splits:
            raise DataDirError(f"no split {name!r} in {self.root / 'split_tasks.json'}; splits: {sorted(self.splits)}")
        return [self.tasks[i] for i in self.splits[name]]

    def task(self, task_id: str) -> dict[str, Any]:
        if task_id not in self.tasks:
            raise DataDirError(f"no task {task_id!r} in {self.root / 'tasks.json'}")
        return self.tasks[task_id]


def task_record(task_id: str, split: str) -> dict[str, Any]:
    """One slime JSONL record. The env builds the conversation itself; ``prompt`` only names the task."""
    return {
        "prompt": f"tau3-retail task {task_id}",
        "label": task_id,
        "metadata": {"env": TAG, "task_id": task_id, "split": split},
    }


def task_id_of(label: Any, metadata: Mapping[str, Any]) -> str:
    """The task id of a record: ``metadata.task_id``, else the label."""
    task_id = metadata.get("task_id", label)
    if task_id is None or task_id == "":
        raise DataDirError("retail record has neither metadata.task_id nor a label naming the task")
    return str(task_id)


def records(data: RetailData, split: str) -> list[dict[str, Any]]:
    return [task_record(str(t["id"]), split) for t in data.split(split)]


def main(argv: list[str] | None = None) -> int:
    """Write the task records of one split as slime JSONL."""
    parser = argparse.ArgumentParser(prog="aclarena data prepare retail", description=main.__doc__)
    parser.add_argument(
        "--data", required=True, help="τ³-Retail data directory (db.json, tasks.json, split_tasks.json, policy.md)"
    )
    parser.add_argument("--split", default="train", help=f"split to write (τ³ ships {', '.join(SPLITS)})")
    parser.add_argument("--out", default="-", help="output JSONL file ('-' for stdout)")
    args = parser.parse_args(argv)
    try:
        rows = records(RetailData.load(args.data), args.split)
    except (DataDirError, ValueError) as exc:
        print(f"retail data: {exc}", file=sys.stderr)
        return 2
    if args.out == "-":
        sys.stdout.write("".join(json.dumps(r) + "\n" for r in rows))
    else:
        written = write_jsonl_atomic(rows, args.out)  # an interrupted run never leaves half a file
        print(f"wrote {written} {args.split} records to {args.out}", file=sys.stderr)
    return 0
