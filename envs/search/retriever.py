"""Retrievers behind one interface: BM25 in-process, a remote Search-R1 server, or dense (faiss).

A corpus is JSONL, one ``{"id", "contents"}`` object a line with ``contents = '"Title"\\ntext'``
(wiki-18's format). The BM25 index is built once and cached in a folder beside the corpus,
``<corpus>.bm25s/``, keyed by the corpus's size, modification time and a hash of its first and last
mebibyte: editing the corpus rebuilds the index, restarting a job does not. Documents are read back
from the corpus itself through a table of line offsets, so a 13 GB wiki-18 corpus is never held in
memory twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import logging
import mmap
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from aclarena_slime.http_service import read_capped

log = logging.getLogger(__name__)

Document = Mapping[str, Any]
CACHE_FORMAT = 1
_FINGERPRINT_BYTES = 1 << 20


class RetrieverError(RuntimeError):
    """The retriever could not answer (server unreachable, malformed reply)."""


@dataclass(frozen=True)
class Hit:
    """A retrieved document (``{"id", "contents"}``) and its score (higher is better)."""

    document: Document
    score: float


class Retriever(Protocol):
    """What the environment and the server need: batched top-k retrieval."""

    async def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """Top ``topk`` hits per query, best first; fewer when fewer documents match."""
        ...

    async def aclose(self) -> None:
        """Release files, sessions, pools."""
        ...


# --------------------------------------------------------------------------- corpus access


def _check_document(raw: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(doc, dict) or "contents" not in doc or "id" not in doc:
        raise ValueError(f'{where}: expected an object with "id" and "contents"')
    return doc


class CorpusFile(Sequence[Document]):
    """Random access to the documents of a JSONL corpus through its line offsets (memory-mapped)."""

    def __init__(self, path: Path, offsets: np.ndarray) -> None:
        self.path, self.offsets = Path(path), offsets
        self._file = self.path.open("rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if len(offsets) else None

    @staticmethod
    def scan(path: Path) -> tuple[np.ndarray, list[str]]:
        """Line offsets of the documents and their contents; raises ValueError naming the bad line."""
        offsets: list[int] = []
        contents: list[str] = []
        for lineno, position, line in _nonblank_lines(path):
            doc = _check_document(line, f"{path}:{lineno}")
            offsets.append(position)
            contents.append(str(doc["contents"]))
        return _offsets_array(offsets, path), contents

    @staticmethod
    def line_offsets(path: Path) -> np.ndarray:
        """Line offsets only, nothing parsed or kept: enough when a prebuilt index needs no contents."""
        return _offsets_array([position for _, position, _ in _nonblank_lines(path)], path)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):  # type: ignore[override] - Sequence's overloads; ints are all we use
        start = int(self.offsets[i])
        end = self._map.find(b"\n", start)
        raw = self._map[start : end if end >= 0 else len(self._map)]
        doc = json.loads(raw)
        return {"id": str(doc["id"]), "contents": doc["contents"]}

    def __iter__(self) -> Iterator[Document]:
        return (self[i] for i in range(len(self)))

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        self._file.close()


def _nonblank_lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """``(line number, byte offset, line)`` of each non-blank line of a corpus."""
    with Path(path).open("rb") as f:
        position = 0
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                yield lineno, position, line
            position += len(line)


def _offsets_array(offsets: list[int], path: Path) -> np.ndarray:
    if not offsets:
        raise ValueError(f"{path}: the corpus holds no documents")
    return np.asarray(offsets, dtype=np.int64)


def corpus_fingerprint(path: Path) -> dict[str, Any]:
    """What identifies a corpus version cheaply: size, mtime and a hash of its two ends."""
    stat = Path(path).stat()
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        if stat.st_size > _FINGERPRINT_BYTES:
            f.seek(max(_FINGERPRINT_BYTES, stat.st_size - _FINGERPRINT_BYTES))
            digest.update(f.read())
    return {
        "format": CACHE_FORMAT,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256_ends": digest.hexdigest(),
    }


def default_cache_dir(corpus: Path) -> Path:
    corpus = Path(corpus)
    return corpus.with_name(corpus.name + ".bm25s")


# --------------------------------------------------------------------------- BM25


def _tokenize(texts: Sequence[str], *, ids: bool):
    import bm25s

    return bm25s.tokenize(list(texts), stopwords="en", return_ids=ids, show_progress=False)


class BM25Retriever:
    """Okapi BM25 (``bm25s``, Lucene variant) over a corpus; CPU only, numpy only."""

    def __init__(self, index: Any, documents: Sequence[Document]) -> None:
        self.index, self.documents = index, documents
        # One worker: BM25 scoring holds the GIL, so parallel threads only contend (measured in
        # benchmarks/bench_retrieval.py); queued searches keep the event loop free all the same.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bm25")

    @classmethod
    def from_documents(cls, documents: Sequence[Document]) -> BM25Retriever:
        """An index over documents held in memory (the demo corpus, tests); nothing is cached."""
        docs = [{"id": str(d["id"]), "contents": str(d["contents"])} for d in documents]
        if not docs:
            raise ValueError("cannot build a BM25 index over no documents")
        return cls(cls._build([d["contents"] for d in docs]), docs)

    @classmethod
    def from_corpus(cls, path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> BM25Retriever:
        """Load the cached index of a JSONL corpus, building (and caching) it when absent or stale."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"search corpus not found: {path}")
        cache = Path(cache_dir) if cache_dir else default_cache_dir(path)
        fingerprint = corpus_fingerprint(path)
        loaded = cls._load_cache(cache, fingerprint)
        if loaded is not None:
            index, offsets = loaded
            log.info("search: loaded the BM25 index of %s from %s", path, cache)
            return cls(index, CorpusFile(path, offsets))
        log.info("search: building the BM25 index of %s (cached in %s)", path, cache)
        offsets, contents = CorpusFile.scan(path)
        index = cls._build(contents)
        del contents
        cls._save_cache(cache, fingerprint, index, offsets)
        return cls(index, CorpusFile(path, offsets))

    @staticmethod
    def _build(contents: Sequence[str]) -> Any:
        import bm25s

        index = bm25s.BM25()
        index.index(_tokenize(contents, ids=True), show_progress=False)
        return index

    @staticmethod
    def _load_cache(cache: Path, fingerprint: dict[str, Any]) -> tuple[Any, np.ndarray] | None:
        import bm25s

        try:
            if json.loads((cache / "fingerprint.json").read_text()) != fingerprint:
                log.info("search: the corpus changed since %s was built; rebuilding", cache)
                return None
            index = bm25s.BM25.load(str(cache), mmap=True, show_progress=False)
            return index, np.load(cache / "offsets.npy")
        except (OSError, ValueError, KeyError):
            return None

    @staticmethod
    def _save_cache(cache: Path, fingerprint: dict[str, Any], index: Any, offsets: np.ndarray) -> None:
        """Write into a fresh folder and rename it into place, so a reader never sees half a cache."""
        try:
            tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
        except OSError as exc:
            log.warning("search: cannot cache the BM25 index beside the corpus (%s); it will be rebuilt next time", exc)
            return
        try:
            index.save(str(tmp), show_progress=False)
            np.save(tmp / "offsets.npy", offsets)
            (tmp / "fingerprint.json").write_text(json.dumps(fingerprint))
            shutil.rmtree(cache, ignore_errors=True)
            os.replace(tmp, cache)
        except OSError as exc:  # e.g. another process renamed its copy first: theirs is as good
            log.warning("search: could not store the BM25 cache in %s (%s)", cache, exc)
            shutil.rmtree(tmp, ignore_errors=True)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """Blocking batched retrieval; documents that share no term with a query are left out."""
        if topk < 1:
            raise ValueError(f"topk must be at least 1, got {topk}")
        if not queries:
            return []
        k = min(topk, len(self.documents))
        doc_ids, scores = self.index.retrieve(_tokenize(queries, ids=False), k=k, show_progress=False)
        return [
            [Hit(self.documents[int(i)], float(s)) for i, s in zip(row_ids, row_scores, strict=True) if s > 0]
            for row_ids, row_scores in zip(doc_ids, scores, strict=True)
        ]

    async def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        return await asyncio.get_running_loop().run_in_executor(self._worker, self.search, list(queries), topk)

    async def aclose(self) -> None:
        self._worker.shutdown(wait=False)
        if isinstance(self.documents, CorpusFile):
            self.documents.close()


# --------------------------------------------------------------------------- remote (Search-R1 API)


class RemoteRetriever:
    """A client of a Search-R1 retrieval server (``POST /retrieve``), ours or the original.

    A connection that fails or is reset (the server restarting, an overloaded proxy) is tried again
    ``retries`` times, waiting ``backoff_s`` and then twice as long each time; a search that still fails is
    logged at WARNING and counted (:attr:`failures`), and its episode aborts. A reply is read only up to
    ``max_bytes``: a huge passage would otherwise be read and tokenized whole on the rollout's event loop.
    """

    def __init__(
        self, url: str, timeout_s: float = 30.0, retries: int = 3, backoff_s: float = 0.5, max_bytes: int = 4 << 20
    ) -> None:
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.timeout_s = timeout_s
        self.retries, self.backoff_s, self.max_bytes = retries, backoff_s, max_bytes
        self.failures = 0  # searches that failed for good (their episodes aborted)
        self._session: Any = None
        self._session_loop: asyncio.AbstractEventLoop | None = None

    async def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
            self._session_loop = loop
        elif self._session_loop is not loop:  # an aiohttp session belongs to the loop that made it
            raise RuntimeError(
                "this retriever client was first used on another event loop; an env instance lives on one loop "
                "(build one per loop, as the rollout context does, and aclose() it there)"
            )
        payload = {"queries": list(queries), "topk": topk, "return_scores": True}
        try:
            body = await self._post(payload)
        except RetrieverError as exc:
            self.failures += 1
            log.warning("%s (%d searches failed so far; their episodes abort)", exc, self.failures)
            raise
        return _parse_result(body, len(queries), self.url)

    async def _post(self, payload: dict[str, Any]) -> Any:
        """One search, with a connection that fails or is reset tried again; the decoded reply."""
        import aiohttp

        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                async with self._session.post(self.url, json=payload) as resp:
                    if resp.status != 200:
                        raise RetrieverError(f"retriever {self.url} answered {resp.status}: {(await resp.text())[:300]}")
                    return json.loads(await read_capped(resp, self.max_bytes, self._too_big))
            except aiohttp.ClientConnectionError as exc:  # refused, reset, disconnected: worth another try
                error = exc
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                raise RetrieverError(f"retriever {self.url} failed: {exc!r}") from exc
        raise RetrieverError(f"retriever {self.url} failed after {self.retries + 1} attempts: {error!r}") from error

    def _too_big(self, what: str) -> RetrieverError:
        return RetrieverError(f"retriever {self.url} sent {what} (retriever_max_bytes)")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = self._session_loop = None


def _parse_result(body: Any, n_queries: int, url: str) -> list[list[Hit]]:
    """Read ``{"result": [[{"document", "score"} | document, ...] per query]}``, either shape."""
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, list) or len(result) != n_queries:
        raise RetrieverError(f"retriever {url} sent no 'result' list of {n_queries} entries: {str(body)[:300]}")
    hits: list[list[Hit]] = []
    for row in result:
        if not isinstance(row, list):
            raise RetrieverError(f"retriever {url} sent a result entry that is not a list: {str(row)[:300]}")
        parsed = []
        for item in row:
            doc, score = (
                (item["document"], item.get("score", 0.0))
                if isinstance(item, dict) and "document" in item
                else (item, 0.0)
            )
            if not isinstance(doc, dict) or "contents" not in doc:
                raise RetrieverError(f"retriever {url} sent a document without 'contents': {str(item)[:300]}")
            parsed.append(Hit(doc, float(score)))
        hits.append(parsed)
    return hits


# --------------------------------------------------------------------------- dense (optional extra)

#: ``encode(texts, is_query)`` -> array (n, dim); E5-style models prefix "query: "/"passage: " themselves.
Encoder = Callable[[list[str], bool], np.ndarray]


def load_encoder(dotted: str) -> Encoder:
    """Import ``package.module:function`` (the user's encoder) and check that it is callable."""
    module_name, _, attr = dotted.partition(":")
    if not module_name or not attr:
        raise ValueError(f"encoder must be 'package.module:function', got {dotted!r}")
    encoder = getattr(importlib.import_module(module_name), attr, None)
    if not callable(encoder):
        raise ValueError(f"encoder {dotted!r} is not a callable")
    return encoder


class DenseRetriever:
    """Inner-product search over normalised embeddings with faiss (``pip install aclarena-slime[dense]``)."""

    def __init__(self, encode: Encoder, index: Any, documents: Sequence[Document]) -> None:
        self.encode, self.index, self.documents = encode, index, documents

    @classmethod
    def from_corpus(
        cls,
        path: str | os.PathLike,
        encode: Encoder,
        index_path: str | os.PathLike | None = None,
        batch_size: int = 512,
    ) -> DenseRetriever:
        """Read a prebuilt faiss index from ``index_path`` or build one (and write it there when given)."""
        faiss = _import_faiss()
        if index_path and Path(index_path).is_file():  # offsets only: a 13 GB corpus's contents are not needed
            offsets = CorpusFile.line_offsets(Path(path))
            index = faiss.read_index(str(index_path))
            if index.ntotal != len(offsets):
                raise ValueError(f"faiss index {index_path} holds {index.ntotal} vectors, the corpus {len(offsets)}")
            dim = _normalised(encode(["dimension probe"], True)).shape[1]
            if index.d != dim:  # built by another encoder: every search would fail, so fail here
                raise ValueError(
                    f"faiss index {index_path} holds {index.d}-dimensional vectors, the encoder makes {dim}: "
                    "rebuild it with this encoder"
                )
        else:
            offsets, contents = CorpusFile.scan(Path(path))
            vectors = [
                _normalised(encode(contents[i : i + batch_size], False)) for i in range(0, len(contents), batch_size)
            ]
            index = faiss.IndexFlatIP(vectors[0].shape[1])
            for block in vectors:
                index.add(block)
            if index_path:
                faiss.write_index(index, str(index_path))
        return cls(encode, index, CorpusFile(Path(path), offsets))

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        if topk < 1:
            raise ValueError(f"topk must be at least 1, got {topk}")
        if not queries:
            return []
        scores, ids = self.index.search(_normalised(self.encode(list(queries), True)), min(topk, len(self.documents)))
        return [
            [Hit(self.documents[int(i)], float(s)) for i, s in zip(r_ids, r_scores, strict=True) if i >= 0]
            for r_ids, r_scores in zip(ids, scores, strict=True)
        ]

    async def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        return await asyncio.to_thread(self.search, list(queries), topk)

    async def aclose(self) -> None:
        if isinstance(self.documents, CorpusFile):
            self.documents.close()


def _import_faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:
        raise ImportError("dense retrieval needs faiss: pip install 'aclarena-slime[dense]' (faiss-cpu)") from exc
    return faiss


def _normalised(vectors: np.ndarray) -> np.ndarray:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"the encoder must return a 2-D array (texts x dim), got shape {vectors.shape}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
