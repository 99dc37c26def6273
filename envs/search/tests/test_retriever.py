"""The BM25 retriever over a JSONL corpus: results, the on-disk cache and its invalidation, bad corpora."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import numpy as np
import pytest

from aclarena_envs.search.demo_corpus import generate, write_jsonl
from aclarena_envs.search.retriever import (
    BM25Retriever,
    CorpusFile,
    DenseRetriever,
    RetrieverError,
    _parse_result,
    default_cache_dir,
)

DEMO = generate(120, seed=1)


@pytest.fixture
def corpus(tmp_path):
    return write_jsonl(DEMO.passages, tmp_path / "corpus.jsonl")


def _titles(hits):
    return [h.document["contents"].split("\n")[0].strip('"') for h in hits]


def test_the_passage_that_answers_ranks_first(corpus):
    r = BM25Retriever.from_corpus(corpus)
    question = DEMO.questions[0]  # "What is the capital of <country>?"
    country = question.question.removeprefix("What is the capital of ").rstrip("?")
    [hits] = r.search([question.question], 3)
    assert len(hits) == 3 and _titles(hits)[0] == country
    assert question.answers[0] in hits[0].document["contents"]
    assert hits[0].score >= hits[1].score >= hits[2].score > 0
    assert set(hits[0].document) == {"id", "contents"}


def test_batched_equals_one_by_one_and_unmatched_queries_get_nothing(corpus):
    r = BM25Retriever.from_corpus(corpus)
    queries = [q.question for q in DEMO.questions[:5]] + ["", "zzzqqq xxyyzz", "the of and"]
    batched = r.search(queries, 3)
    assert batched == [r.search([q], 3)[0] for q in queries]
    assert batched[-3:] == [[], [], []]
    assert len(r.search(["capital"], 10_000)[0]) <= len(DEMO.passages)
    with pytest.raises(ValueError, match="topk"):
        r.search(["x"], 0)


def test_index_is_cached_beside_the_corpus_and_rebuilt_when_it_changes(corpus, monkeypatch):
    builds = []
    real_build = BM25Retriever._build
    monkeypatch.setattr(BM25Retriever, "_build", staticmethod(lambda c: builds.append(len(c)) or real_build(c)))
    first = BM25Retriever.from_corpus(corpus)
    assert (default_cache_dir(corpus) / "fingerprint.json").is_file() and builds == [120]
    second = BM25Retriever.from_corpus(corpus)
    assert builds == [120], "an unchanged corpus must reuse the cache"
    assert second.search(["capital"], 3) == first.search(["capital"], 3)

    extra = {"id": "new", "contents": '"Zyxwv Quorbl"\nZyxwv Quorbl is a lighthouse keeper.'}
    with corpus.open("a") as f:
        f.write(json.dumps(extra) + "\n")
    third = BM25Retriever.from_corpus(corpus)
    assert builds == [120, 121]
    assert third.search(["lighthouse keeper Quorbl"], 1)[0][0].document["id"] == "new"


def test_same_size_edit_is_detected(corpus):
    BM25Retriever.from_corpus(corpus)
    stat = corpus.stat()
    text = corpus.read_text().replace("capital", "kapital", 1)
    corpus.write_text(text)
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime: only the hash differs
    assert BM25Retriever.from_corpus(corpus).search(["kapital"], 1)[0], "the edited word must be indexed"


def test_unwritable_cache_still_serves(corpus, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    r = BM25Retriever.from_corpus(corpus, cache_dir=blocker / "cache")
    assert r.search(["capital"], 1)[0]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"id": "1", "contents": "ok"}', "{broken"], r"corpus.jsonl:2: not valid JSON"),
        (['{"id": "1", "text": "no contents"}'], r'corpus.jsonl:1: expected an object with "id" and "contents"'),
        ([""], "holds no documents"),
    ],
)
def test_bad_corpus_lines_are_named(tmp_path, lines, message):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message):
        BM25Retriever.from_corpus(path)


def test_missing_corpus():
    with pytest.raises(FileNotFoundError, match="search corpus not found"):
        BM25Retriever.from_corpus("/nonexistent/corpus.jsonl")


def test_search_r1_result_shapes_are_both_read():
    doc = {"id": "1", "contents": '"T"\nx'}
    scored = _parse_result({"result": [[{"document": doc, "score": 2.5}]]}, 1, "u")
    bare = _parse_result({"result": [[doc]]}, 1, "u")
    assert scored[0][0].score == 2.5 and bare[0][0].document == doc
    for body in ({"result": []}, {"nope": 1}, {"result": [[{"id": "1"}]]}, {"result": ["x"]}):
        with pytest.raises(RetrieverError):
            _parse_result(body, 1, "u")


def _bag_of_words(texts, is_query):
    """A toy encoder: hashed word counts (enough to check the dense plumbing, not retrieval quality)."""
    out = np.zeros((len(texts), 256), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in text.lower().replace('"', " ").split():
            out[row, hash(word) % 256] += 1.0
    return out


def test_dense_retriever_with_faiss(corpus, tmp_path):
    pytest.importorskip("faiss", reason="faiss-cpu is the optional 'dense' extra")
    index_path = tmp_path / "flat.index"
    r = DenseRetriever.from_corpus(corpus, _bag_of_words, index_path=index_path)
    query = DEMO.passages[7]["contents"]  # a passage is its own nearest neighbour (cosine 1)
    [hits] = r.search([query], 2)
    assert hits[0].document == {"id": "7", "contents": DEMO.passages[7]["contents"]}
    again = DenseRetriever.from_corpus(corpus, _bag_of_words, index_path=index_path)  # read back from disk
    assert again.search([query], 2) == [hits]


def test_dense_with_a_prebuilt_index_reads_offsets_not_contents(corpus, tmp_path, monkeypatch):
    pytest.importorskip("faiss", reason="faiss-cpu is the optional 'dense' extra")
    index_path = tmp_path / "flat.index"
    asyncio.run(DenseRetriever.from_corpus(corpus, _bag_of_words, index_path=index_path).aclose())

    def no_scan(path):
        raise AssertionError("the corpus contents were read although the index exists")

    monkeypatch.setattr(CorpusFile, "scan", staticmethod(no_scan))
    again = DenseRetriever.from_corpus(corpus, _bag_of_words, index_path=index_path)
    [hits] = again.search([DEMO.passages[3]["contents"]], 1)
    asyncio.run(again.aclose())
    assert hits[0].document["id"] == "3"


def test_dense_without_faiss_says_how_to_get_it(corpus, monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # makes "import faiss" fail, installed or not
    with pytest.raises(ImportError, match="faiss-cpu"):
        DenseRetriever.from_corpus(corpus, _bag_of_words)
