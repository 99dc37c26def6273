"""Search data into slime JSONL: Search-R1's NQ+HotpotQA parquet, FlashRAG-style JSONL, or the demo set.

A record becomes ``{"prompt": question, "label": {"target": [gold answers]}, "metadata": {"env":
"search", "data_source", "hop", ...}}``. The label keeps Search-R1's ground-truth shape; the prompt is
the bare question (the env wraps it in Search-R1's instruction, so one file serves every template).
``hop`` tags the evaluation sets the way the Search-R1 paper groups them: single-hop (NQ, TriviaQA,
PopQA) and multi-hop (HotpotQA, 2WikiMultiHopQA, Musique, Bamboogle).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import iter_jsonl, write_jsonl_atomic

from . import demo_corpus
from .retriever import BM25Retriever

SINGLE_HOP = ("nq", "triviaqa", "popqa")
MULTI_HOP = ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


def hop_of(data_source: str) -> str | None:
    """``single`` / ``multi`` for the known QA sets, None for others."""
    name = data_source.lower()
    if name in SINGLE_HOP:
        return "single"
    if name in MULTI_HOP:
        return "multi"
    return None


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a parquet or JSONL file; a bad JSON line is reported with its number."""
    if not path.is_file():
        raise FileNotFoundError(f"no such input file: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
            yield from batch.to_pylist()
        return
    for _, record in iter_jsonl(path):
        yield record


def question_of(record: dict[str, Any]) -> str:
    """The bare question; from Search-R1's chat prompt (after ``Question:``) when no ``question`` column."""
    question = record.get("question")
    if not question and isinstance(record.get("prompt"), list):
        content = next((m.get("content", "") for m in record["prompt"] if m.get("role") == "user"), "")
        question = content.rpartition("Question:")[2]
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"record has no question: keys {sorted(record)}")
    return question.strip()


def answers_of(record: dict[str, Any]) -> list[str]:
    """Gold answers from ``golden_answers`` or ``reward_model.ground_truth.target``."""
    golds = record.get("golden_answers")
    if golds is None:
        golds = ((record.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, (list, tuple)) or not golds:
        raise ValueError(f"record has no gold answers: keys {sorted(record)}")
    return [str(g) for g in golds]


def to_slime(records: Iterable[dict[str, Any]], source: str | None, split: str | None) -> Iterator[dict[str, Any]]:
    """slime records; ``source`` overrides each row's ``data_source``."""
    for n, record in enumerate(records, 1):
        try:
            question, golds = question_of(record), answers_of(record)
        except ValueError as exc:
            raise ValueError(f"record {n}: {exc}") from None
        data_source = source or str(record.get("data_source") or "unknown")
        metadata: dict[str, Any] = {"env": "search", "data_source": data_source}
        if hop := hop_of(data_source):
            metadata["hop"] = hop
        if split:
            metadata["split"] = split
        if record.get("id") is not None:
            metadata["id"] = str(record["id"])
        yield {"prompt": question, "label": {"target": golds}, "metadata": metadata}


def convert(paths: Iterable[Path], source: str | None, split: str | None) -> Iterator[dict[str, Any]]:
    """All input files in order; an error names the file."""
    for path in paths:
        try:
            yield from to_slime(read_records(path), source, split)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


def demo_records(
    questions: Iterable[demo_corpus.DemoQuestion], split: str, tag: str = "search"
) -> Iterator[dict[str, Any]]:
    for i, q in enumerate(questions):
        metadata = {"env": tag, "data_source": f"demo_{q.hop}", "hop": q.hop, "split": split, "id": f"{split}-{i}"}
        yield {"prompt": q.question, "label": {"target": q.answers}, "metadata": metadata}


def write_demo(directory: Path, n_passages: int, seed: int) -> dict[str, Any]:
    """The demo corpus and its questions (80% train, 20% test) under ``directory``."""
    corpus = demo_corpus.generate(n_passages, seed)
    corpus_path = demo_corpus.write_jsonl(corpus.passages, directory / "corpus.jsonl")
    cut = int(len(corpus.questions) * 0.8)
    n_train = write_jsonl_atomic(demo_records(corpus.questions[:cut], "train"), directory / "train.jsonl")
    n_test = write_jsonl_atomic(demo_records(corpus.questions[cut:], "test"), directory / "test.jsonl")
    return {"corpus": str(corpus_path), "passages": len(corpus.passages), "train": n_train, "test": n_test}


def main(argv: list[str]) -> int:
    """``aclarena data prepare search ...`` (the env's ``prepare_data`` hook); ``... dense-index`` builds
    an E5 index (:mod:`.e5`)."""
    if argv[:1] == ["dense-index"]:
        from .e5 import main as dense_index_main

        return dense_index_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="aclarena data prepare search",
        description="Convert Search-R1 QA data (parquet/JSONL: question, golden_answers, data_source) into slime "
        "JSONL for the search env, or write the generated demo corpus and QA set.",
    )
    parser.add_argument("--input", type=Path, action="append", default=[], help="parquet or JSONL file (repeatable)")
    parser.add_argument("--output", type=Path, help="slime JSONL to write")
    parser.add_argument("--source", default=None, help="data_source for every record (default: the row's own)")
    parser.add_argument("--split", default=None, help="split name for metadata, e.g. train or test")
    parser.add_argument("--demo", type=Path, default=None, metavar="DIR", help="write the demo corpus and QA set here")
    parser.add_argument("--demo-passages", type=int, default=600, help="demo corpus size (default 600)")
    parser.add_argument("--seed", type=int, default=0, help="demo generator seed")
    args = parser.parse_args(argv)
    if args.demo:
        print(json.dumps(write_demo(args.demo, args.demo_passages, args.seed)))
        return 0
    if not args.input or not args.output:
        parser.error("give --input FILE... and --output FILE, or --demo DIR")
    try:
        n = write_jsonl_atomic(convert(args.input, args.source, args.split), args.output)
    except (ValueError, FileNotFoundError) as exc:
        print(f"aclarena data prepare search: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"written": n, "output": str(args.output)}))
    return 0


def demo_turns(record: dict[str, Any]) -> list[str]:
    """The gold model turns for a demo record: search with the question, then give the first gold answer.

    The local backend's SFT warm start replays these through the env. A demo must be *grounded*: its
    answer is written only when the first passage the question retrieves from the demo corpus holds it
    (so it is in the observation whatever the env's ``topk``); otherwise the demo searches and stops,
    the episode scores 0 and the replay's reward filter drops it. Answers that no passage showed
    would teach the model to recall answers instead of reading them.
    """
    label = record.get("label")
    answers = label.get("target") if isinstance(label, dict) else label
    answers = answers if isinstance(answers, list) else [answers]
    question = str(record["prompt"])
    turns = [f"<search> {question} </search>"]
    [hits] = _demo_retriever().search([question], 1)
    passage = hits[0].document["contents"] if hits else ""
    if any(str(answer) in passage for answer in answers):
        turns.append(f"<answer> {answers[0]} </answer>")
    return turns


@functools.cache
def _demo_retriever() -> BM25Retriever:
    """The embedded retriever over the default demo corpus, as the env builds it without a corpus."""
    return BM25Retriever.from_documents(demo_corpus.generate(demo_corpus.DEMO_PASSAGES).passages)
