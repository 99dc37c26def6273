"""Math data into slime JSONL records (``prompt``, ``label``, ``metadata.env = "math"``).

Sources: DAPO-Math-17k (parquet or JSONL, its chat-style prompt and ``reward_model.ground_truth``),
and AIME-style JSONL (``problem``, ``answer``; AIME 2026 is supplied by the user). Prompts are stored
bare; the env adds its answer-format instruction, so the same records serve every template.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import iter_jsonl, write_jsonl_atomic

# DAPO-Math-17k wraps each problem in an "Answer: $Answer" instruction; we keep only the problem.
_DAPO_HEAD = re.compile(r"^Solve the following math problem step by step\..*?\n\n", re.S)
_DAPO_TAIL = re.compile(r"\n\nRemember to put your answer on its own line after \"Answer:\"\.?\s*$")


def read_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, record)``: ``where`` is ``file:line`` (parquet: ``file:row``) for error messages."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for row, record in enumerate(pq.read_table(path).to_pylist(), 1):
            yield f"{path}:row {row}", record
        return
    for line, record in iter_jsonl(path):
        yield f"{path}:{line}", record


def problem_text(record: dict[str, Any]) -> str:
    prompt = record.get("problem") or record.get("question") or record.get("prompt")
    if isinstance(prompt, list):  # chat-style: the user turn holds the problem
        prompt = next((m.get("content") for m in prompt if m.get("role") == "user"), None)
    if not prompt:
        raise ValueError(f"record has no problem text: keys {sorted(record)}")
    return _DAPO_TAIL.sub("", _DAPO_HEAD.sub("", str(prompt))).strip()


def answer_text(record: dict[str, Any]) -> str:
    for key in ("answer", "label", "ground_truth"):
        if record.get(key) not in (None, ""):
            return str(record[key]).strip()
    reward_model = record.get("reward_model") or {}
    if reward_model.get("ground_truth") not in (None, ""):
        return str(reward_model["ground_truth"]).strip()
    raise ValueError(f"record has no answer: keys {sorted(record)}")


def to_slime(
    records: Iterable[tuple[str, dict[str, Any]]], source: str, split: str | None = None
) -> Iterator[dict[str, Any]]:
    """slime records from ``(where, record)`` pairs; a record that cannot be converted raises
    ValueError starting with its ``where``, so a user can find it among 17k lines."""
    for i, (where, record) in enumerate(records):
        metadata: dict[str, Any] = {"env": "math", "source": record.get("data_source") or source, "index": i}
        if split:
            metadata["split"] = split
        try:
            prompt, label = problem_text(record), answer_text(record)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        yield {"prompt": prompt, "label": label, "metadata": metadata}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="aclarena data prepare math",
        description="Convert DAPO-Math-17k or AIME-style data into slime JSONL for the math env.",
    )
    parser.add_argument("--input", type=Path, required=True, help="JSONL or parquet file")
    parser.add_argument("--output", type=Path, required=True, help="slime JSONL to write")
    parser.add_argument("--source", default=None, help="source name for metadata (default: the file's stem)")
    parser.add_argument("--split", default=None, help="split name for metadata, e.g. train or aime26")
    args = parser.parse_args(argv)
    n = write_jsonl_atomic(to_slime(read_records(args.input), args.source or args.input.stem, args.split), args.output)
    print(json.dumps({"written": n, "output": str(args.output)}))
    return 0


def demo_turns(record: dict[str, Any]) -> list[str]:
    """The gold model turn for a record (its answer, boxed): the local backend's SFT warm start replays it.

    Demo records are ``"What is a op b?"``; the turn restates the sum before boxing its value, so the
    answer is written next to the operands it depends on. Any other record gets the bare boxed label.
    """
    label = str(record.get("label", "")).strip()
    match = re.fullmatch(r"What is (-?\d+ [-+*] -?\d+)\?", str(record.get("prompt", "")).strip())
    return [f"{match.group(1)} = \\boxed{{{label}}}" if match else f"\\boxed{{{label}}}"]
