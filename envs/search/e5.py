"""E5 dense retrieval, as the ACLArena authors serve it: E5-base-v2 embeddings in a flat FAISS index over wiki-18.

Facts from WillDreamer/ACLArena ``slime/examples/search-r1/``: ``run_qwen3_8b_seq_search.sh`` serves
``wiki-18/e5_Flat.index`` over ``wiki-18.jsonl`` with ``e5-base-v2`` (lines 74-76, 299-305), top-3
(line 72); ``local_dense_retriever/retrieval_server.py`` prefixes ``"query: "`` / ``"passage: "`` for E5
(lines 89-93), mean-pools the last hidden state over the attention mask and L2-normalises (60-63,
115-119), with at most 256 tokens a text and batches of 512 (419-422). The index is a flat
inner-product index, so a score is the cosine similarity of query and passage.

Build the index once (streamed: the corpus is never held in memory)::

    aclarena data prepare search dense-index --corpus wiki-18.jsonl --e5-model e5-base-v2 --out e5_Flat.index

and serve it with ``aclarena serve-retriever --corpus wiki-18.jsonl --e5-model e5-base-v2 --dense-index
e5_Flat.index``, or set ``e5_model`` and ``dense_index`` beside ``corpus`` in the env config.
Needs ``faiss-cpu`` (``pip install 'aclarena-slime[dense]'``) and torch + transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .config import SearchConfig
from .retriever import _check_document, _import_faiss, _nonblank_lines, load_encoder

QUERY_PREFIX, PASSAGE_PREFIX = "query: ", "passage: "
MAX_LENGTH = 256  # retrieval_server.py:420 (retrieval_query_max_length)
BATCH_SIZE = 512  # retrieval_server.py:422 (retrieval_batch_size)


class E5Encoder:
    """``encode(texts, is_query) -> (n, dim) float32``: prefixed, mean-pooled over real tokens, unit length."""

    def __init__(self, model_path: str | os.PathLike, max_length: int = MAX_LENGTH, batch_size: int = BATCH_SIZE):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.model = AutoModel.from_pretrained(str(model_path)).eval()
        self.max_length, self.batch_size = max_length, batch_size
        self.dim = int(self.model.config.hidden_size)
        self._torch = torch

    def __call__(self, texts: Sequence[str], is_query: bool) -> np.ndarray:
        prefix = QUERY_PREFIX if is_query else PASSAGE_PREFIX
        blocks = [
            self._encode([prefix + t for t in texts[i : i + self.batch_size]])
            for i in range(0, len(texts), self.batch_size)
        ]
        return np.concatenate(blocks) if blocks else np.zeros((0, self.dim), dtype=np.float32)

    def _encode(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        batch = self.tokenizer(texts, max_length=self.max_length, padding=True, truncation=True, return_tensors="pt")
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state.float()
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # padding must not dilute the mean
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy().astype(np.float32)


def _batches(corpus: Path, size: int) -> Iterator[list[str]]:
    block: list[str] = []
    for lineno, _, line in _nonblank_lines(corpus):
        block.append(str(_check_document(line, f"{corpus}:{lineno}")["contents"]))
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block


def build_index(corpus: str | os.PathLike, encoder: Any, out: str | os.PathLike, batch_size: int = BATCH_SIZE) -> int:
    """Encode every passage of ``corpus`` (streamed) into a flat inner-product index at ``out``.

    The file appears only when complete (written beside it, then renamed); returns the passage count.
    """
    faiss = _import_faiss()
    corpus, out = Path(corpus), Path(out)
    if not corpus.is_file():
        raise FileNotFoundError(f"search corpus not found: {corpus}")
    index = None
    for block in _batches(corpus, batch_size):
        vectors = np.ascontiguousarray(encoder(block, False), dtype=np.float32)
        if index is None:
            index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
    if index is None:
        raise ValueError(f"{corpus}: the corpus holds no documents")
    tmp = out.with_name(out.name + ".tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, out)
    return int(index.ntotal)


def main(argv: list[str]) -> int:
    """``aclarena data prepare search dense-index ...``: the E5 flat index of a corpus."""
    parser = argparse.ArgumentParser(
        prog="aclarena data prepare search dense-index",
        description="Encode a JSONL corpus ({'id', 'contents'} a line) with an E5 model into a flat FAISS "
        "inner-product index, as the ACLArena authors retrieve (e5-base-v2 over wiki-18). Needs faiss-cpu.",
    )
    parser.add_argument("--corpus", type=Path, required=True, help="JSONL corpus to index")
    parser.add_argument("--e5-model", type=Path, required=True, help="E5 model folder (e.g. e5-base-v2)")
    parser.add_argument("--out", type=Path, required=True, help="index file to write (e.g. e5_Flat.index)")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help=f"passages per batch (default {BATCH_SIZE})")
    parser.add_argument("--max-length", type=int, default=MAX_LENGTH, help=f"tokens per passage (default {MAX_LENGTH})")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.max_length < 1:
        parser.error("--batch-size and --max-length must be positive")
    try:
        encoder = E5Encoder(args.e5_model, max_length=args.max_length, batch_size=args.batch_size)
        n = build_index(args.corpus, encoder, args.out, args.batch_size)
    except (ValueError, OSError, ImportError) as exc:
        print(f"aclarena data prepare search dense-index: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"passages": n, "index": str(args.out)}))
    return 0


def dense_encoder(cfg: SearchConfig) -> Any:
    """The encoder the config names: E5 from ``e5_model``, or the user's ``encoder`` function."""
    return E5Encoder(cfg.e5_model) if cfg.e5_model else load_encoder(str(cfg.encoder))
