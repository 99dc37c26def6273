"""Instruction-following data into slime JSONL (``prompt``, ``label``, ``metadata.env = "ifeval"``).

Three sources, one record shape (the label is JSON text ``{"instruction_id_list", "kwargs"}``):

- ``ifeval``: IFEval's JSONL (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``), for evaluation;
- ``rlvr``: RLVR-IF-style training records — ``messages`` (or ``prompt``) and ``ground_truth``, the
  latter ``[{"instruction_id": [...], "kwargs": [...]}]`` as JSON or Python-literal text. The older
  RLVR-IFeval rows keyed by ``func_name`` use open-instruct's own verifiers, whose semantics differ
  from IFEval's (exact counts, "around"); they are refused rather than scored by the wrong rules;
- ``generate``: prompts composed from the checker registry (:mod:`aclarena_envs.ifeval.generator`).

Every label is built into its checkers before it is written; a record that cannot be scored stops
the conversion with its line number, or with ``--skip-invalid`` is left out and counted.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from aclarena_envs.ifeval.checkers import LabelError
from aclarena_envs.ifeval.generator import generate
from aclarena_envs.ifeval.reward import Label
from aclarena_slime.jsonl import JsonlError, iter_jsonl, write_jsonl_atomic


class RecordError(ValueError):
    """A source record that cannot become a slime record; the message names the file and line."""


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each non-blank line; RecordError on a line that is not a JSON object."""
    try:
        yield from iter_jsonl(path)
    except JsonlError as exc:
        raise RecordError(str(exc)) from None


def from_ifeval(record: dict[str, Any]) -> dict[str, Any]:
    """One IFEval record as a slime record."""
    if not isinstance(record.get("prompt"), str) or not record["prompt"].strip():
        raise LabelError("record has no prompt text")
    label = Label.parse({"instruction_id_list": record.get("instruction_id_list"), "kwargs": record.get("kwargs")})
    label.checkers()
    metadata = {"env": "ifeval", "source": "ifeval", "key": record.get("key")}
    return {"prompt": record["prompt"], "label": label.to_json(), "metadata": metadata}


def _literal(text: str) -> Any:
    """JSON text, else a Python literal (open-instruct writes reprs); LabelError if neither, so
    ``--skip-invalid`` can count it. Literals only, never code."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise LabelError(f"ground_truth is neither JSON nor a Python literal: {text[:120]!r}") from None


def _ground_truth(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = _literal(value)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):  # a one-element list holding the object as text
        value = _literal(value)
    if not isinstance(value, dict):
        raise LabelError(f"ground_truth must hold one object, got {type(value).__name__}")
    if "func_name" in value:
        raise LabelError(
            f"ground_truth uses open-instruct's verifier {value['func_name']!r}, not IFEval instruction ids; "
            "its rules differ from IFEval's, so it is not converted"
        )
    return value


def from_rlvr(record: dict[str, Any]) -> dict[str, Any]:
    """One RLVR-IF record (``messages``/``prompt`` + ``ground_truth``) as a slime record."""
    truth = _ground_truth(record.get("ground_truth"))
    label = Label.parse({"instruction_id_list": truth.get("instruction_id"), "kwargs": truth.get("kwargs")})
    label.checkers()
    messages = record.get("messages")
    if isinstance(messages, list) and messages:
        turns = [dict(m) for m in messages if isinstance(m, dict)]
        if turns and turns[-1].get("role") == "assistant":
            turns = turns[:-1]  # a reference answer, not part of the prompt
        if not any(m.get("role") == "user" for m in turns):
            raise LabelError("messages hold no user turn")
        # A lone user turn becomes plain text; a system turn or earlier turns keep the conversation.
        prompt: str | list[dict[str, Any]] = str(turns[0].get("content", "")) if len(turns) == 1 else turns
    elif isinstance(record.get("prompt"), str):
        prompt = record["prompt"]
    else:
        raise LabelError("record has neither messages nor a prompt")
    metadata = {"env": "ifeval", "source": str(record.get("dataset") or record.get("source") or "rlvr")}
    if "constraint_type" in record:
        metadata["constraint_type"] = record["constraint_type"]
    return {"prompt": prompt, "label": label.to_json(), "metadata": metadata}


_CONVERTERS = {"ifeval": from_ifeval, "rlvr": from_rlvr}


def convert(path: Path, kind: str, skip_invalid: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Converted records and how many were skipped (always 0 unless ``skip_invalid``)."""
    converter = _CONVERTERS[kind]
    records, skipped = [], 0
    for number, record in read_jsonl(path):
        try:
            records.append(converter(record))
        except LabelError as exc:
            if not skip_invalid:
                raise RecordError(f"{path}:{number}: {exc}") from None
            skipped += 1
    return records, skipped


def main(argv: list[str]) -> int:
    """``aclarena data prepare ifeval {ifeval,rlvr,generate} ...``."""
    parser = argparse.ArgumentParser(
        prog="aclarena data prepare ifeval",
        description="Instruction-following data (IFEval, RLVR-IF, or generated prompts) into slime JSONL.",
    )
    sources = parser.add_subparsers(dest="source", metavar="SOURCE", required=True)
    for kind, text in (("ifeval", "IFEval JSONL, for evaluation"), ("rlvr", "RLVR-IF-style training JSONL")):
        sub = sources.add_parser(kind, help=text, description=f"Convert {text} into slime JSONL.")
        sub.add_argument("--input", type=Path, required=True, help="source JSONL")
        sub.add_argument("--output", type=Path, required=True, help="slime JSONL to write")
        sub.add_argument("--skip-invalid", action="store_true", help="leave out (and count) records with bad labels")
    gen = sources.add_parser("generate", help="compose prompts from the checker registry")
    gen.add_argument("--output", type=Path, required=True, help="slime JSONL to write")
    gen.add_argument("--count", type=int, default=1000, help="number of prompts (default 1000)")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    gen.add_argument("--max-instructions", type=int, default=3, help="instructions per prompt, at most (default 3)")
    args = parser.parse_args(argv)

    skipped = 0
    if args.source == "generate":
        if args.count < 1 or args.max_instructions < 1:
            parser.error("--count and --max-instructions must be at least 1")
        prompts = generate(args.count, args.seed, args.max_instructions)
        records: Iterable[dict[str, Any]] = (p.to_slime(i, args.seed) for i, p in enumerate(prompts))
    else:
        if not args.input.is_file():
            parser.error(f"--input {args.input} is not a file")
        try:
            records, skipped = convert(args.input, args.source, args.skip_invalid)
        except RecordError as exc:
            print(f"aclarena data prepare ifeval: {exc}", file=sys.stderr)
            return 2
    written = write_jsonl_atomic(records, args.output)
    print(json.dumps({"written": written, "skipped": skipped, "output": str(args.output)}))
    return 0
