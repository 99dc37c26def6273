"""Picking an expert from the prompt alone, for requests that carry no environment tag.

TF-IDF over word unigrams and bigrams (numbers folded into one token, symbols kept: ``+``, ``^`` and
``\\`` say "math"), then multinomial logistic regression trained by full-batch Adam. Small enough to
train at gateway start in well under a second, and saved as plain JSON (no pickle) when trained
elsewhere. Its accuracy on held-out prompts is printed by ``benchmarks/bench_router.py``.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_TOKEN = re.compile(r"[a-z]+|\d+|[^\sa-z\d]")


def tokens(text: str) -> list[str]:
    """Unigrams and adjacent bigrams; every number is ``<num>``."""
    words = ["<num>" if w[0].isdigit() else w for w in _TOKEN.findall(text.lower())]
    return words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]


class TagClassifier:
    """``predict(text) -> (tag, probability)``; ``train(texts, tags)`` builds one."""

    def __init__(
        self, vocabulary: dict[str, int], idf: np.ndarray, weights: np.ndarray, bias: np.ndarray, tags: list[str]
    ):
        if (
            weights.shape != (len(vocabulary), len(tags))
            or idf.shape != (len(vocabulary),)
            or bias.shape != (len(tags),)
        ):
            raise ValueError("classifier arrays do not match its vocabulary and tags")
        self.vocabulary, self.idf, self.weights, self.bias, self.tags = vocabulary, idf, weights, bias, tags

    def features(self, texts: Sequence[str]) -> _Sparse:
        """L2-normalised TF-IDF rows, kept sparse (a prompt uses a few dozen of the thousands of terms)."""
        rows, cols, vals = [], [], []
        for row, text in enumerate(texts):
            counts = Counter(self.vocabulary[t] for t in tokens(text) if t in self.vocabulary)
            weights = {col: (1.0 + math.log(n)) * float(self.idf[col]) for col, n in counts.items()}
            norm = math.sqrt(sum(w * w for w in weights.values())) or 1.0
            for col, w in weights.items():
                rows.append(row)
                cols.append(col)
                vals.append(w / norm)
        return _Sparse(np.array(rows, np.int64), np.array(cols, np.int64), np.array(vals, np.float64), len(texts))

    def probabilities(self, texts: Sequence[str]) -> np.ndarray:
        return _softmax(self.features(texts).matmul(self.weights) + self.bias)

    def predict(self, text: str) -> tuple[str, float]:
        probs = self.probabilities([text])[0]
        best = int(np.argmax(probs))
        return self.tags[best], float(probs[best])

    def accuracy(self, texts: Sequence[str], tags: Sequence[str]) -> float:
        predicted = np.argmax(self.probabilities(texts), axis=1)
        return float(np.mean([self.tags[i] == t for i, t in zip(predicted, tags, strict=True)]))

    @classmethod
    def train(
        cls,
        texts: Sequence[str],
        tags: Sequence[str],
        *,
        max_features: int = 4096,
        min_df: int = 2,
        l2: float = 1e-4,
        steps: int = 200,
        lr: float = 0.1,
    ) -> TagClassifier:
        if len(texts) != len(tags) or not texts:
            raise ValueError("need as many tags as texts, and at least one of each")
        labels = sorted(set(tags))
        df: Counter[str] = Counter()
        for text in texts:
            df.update(set(tokens(text)))
        kept = sorted((t for t, n in df.items() if n >= min_df), key=lambda t: (-df[t], t))[:max_features]
        vocabulary = {t: i for i, t in enumerate(sorted(kept))}
        idf = np.array([math.log((1 + len(texts)) / (1 + df[t])) + 1.0 for t in sorted(kept)])
        model = cls(vocabulary, idf, np.zeros((len(kept), len(labels))), np.zeros(len(labels)), labels)
        x = model.features(texts)
        y = np.eye(len(labels))[[labels.index(t) for t in tags]]
        model._fit(x, y, l2=l2, steps=steps, lr=lr)
        return model

    def _fit(self, x: _Sparse, y: np.ndarray, *, l2: float, steps: int, lr: float) -> None:
        params = [self.weights, self.bias]
        moments = [(np.zeros_like(p), np.zeros_like(p)) for p in params]
        beta1, beta2 = 0.9, 0.999
        for step in range(1, steps + 1):
            error = (_softmax(x.matmul(self.weights) + self.bias) - y) / x.n_rows
            grads = [x.t_matmul(error, len(self.vocabulary)) + l2 * self.weights, error.sum(axis=0)]
            for p, g, (m, v) in zip(params, grads, moments, strict=True):
                m *= beta1
                m += (1 - beta1) * g
                v *= beta2
                v += (1 - beta2) * g * g
                p -= lr * (m / (1 - beta1**step)) / (np.sqrt(v / (1 - beta2**step)) + 1e-8)

    def save(self, path: str | Path) -> None:
        terms = sorted(self.vocabulary, key=self.vocabulary.__getitem__)
        Path(path).write_text(
            json.dumps(
                {
                    "kind": "aclarena-tag-classifier",
                    "version": 1,
                    "tags": self.tags,
                    "terms": terms,
                    "idf": self.idf.tolist(),
                    "weights": self.weights.tolist(),
                    "bias": self.bias.tolist(),
                }
            )
        )

    @classmethod
    def load(cls, path: str | Path) -> TagClassifier:
        try:
            data = json.loads(Path(path).read_text())
            if data.get("kind") != "aclarena-tag-classifier" or data.get("version") != 1:
                raise ValueError("not a version-1 aclarena tag classifier")
            return cls(
                {t: i for i, t in enumerate(data["terms"])},
                np.asarray(data["idf"], np.float64),
                np.asarray(data["weights"], np.float64).reshape(len(data["terms"]), len(data["tags"])),
                np.asarray(data["bias"], np.float64),
                list(data["tags"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"cannot load tag classifier {path}: {exc}") from exc


class _Sparse:
    """Rows × terms in coordinate form; products by bincount, which beats dense BLAS here by far."""

    def __init__(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_rows: int) -> None:
        self.rows, self.cols, self.vals, self.n_rows = rows, cols, vals, n_rows

    def matmul(self, w: np.ndarray) -> np.ndarray:
        contrib = self.vals[:, None] * w[self.cols]
        return np.stack([np.bincount(self.rows, contrib[:, k], self.n_rows) for k in range(w.shape[1])], axis=1)

    def t_matmul(self, e: np.ndarray, n_cols: int) -> np.ndarray:
        contrib = self.vals[:, None] * e[self.rows]
        return np.stack([np.bincount(self.cols, contrib[:, k], n_cols) for k in range(e.shape[1])], axis=1)


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)
