"""The forgetting matrix of a curriculum and the continual-learning metrics computed from it.

``A[i, j]`` is the accuracy (percent) on domain ``j`` after stage ``i`` (stages in training order);
``s(j)`` is the stage that trained domain ``j`` and ``base[j]`` the initial model's accuracy. With
``T`` the last stage, following Lopez-Paz & Ranzato, "Gradient Episodic Memory for Continual
Learning" (NeurIPS 2017) for ACC, BWT and FWT:

- average accuracy ``ACC = mean_j A[T, j]`` over every evaluated domain;
- backward transfer ``BWT = mean over stages i < T that trained a domain d of (A[T, d] - A[i, d])``
  (negative: forgetting);
- forward transfer ``FWT = mean over stages i > 1 that trained a domain d of (A[i-1, d] - base[d])``:
  how much the earlier stages helped a domain before it was trained (needs the base row);
- maximum forgetting of domain ``j``: ``max over k > s(j) of (A[s(j), j] - A[k, j])``, the worst drop
  below the accuracy reached right after training it (None for the last-trained domain).

A cell may be missing (None): a metric skips the terms that need it and says how many it used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Any


class MatrixError(ValueError):
    pass


@dataclass(frozen=True)
class ForgettingMatrix:
    stages: tuple[str, ...]
    trained: tuple[str | None, ...]  # the domain each stage trained (None: not known / none)
    domains: tuple[str, ...]
    values: tuple[tuple[float | None, ...], ...]  # one row per stage, one column per domain
    base: tuple[float | None, ...] | None = None

    def __post_init__(self) -> None:
        if not self.stages:
            raise MatrixError("a forgetting matrix needs at least one stage")
        if len(self.trained) != len(self.stages) or len(self.values) != len(self.stages):
            raise MatrixError("stages, trained domains and rows must have the same length")
        if any(len(row) != len(self.domains) for row in self.values):
            raise MatrixError("every row needs one value per domain")
        if self.base is not None and len(self.base) != len(self.domains):
            raise MatrixError("the base row needs one value per domain")

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[tuple[str, str | None, Mapping[str, float]]],
        base: Mapping[str, float] | None = None,
        domains: Sequence[str] | None = None,
    ) -> ForgettingMatrix:
        """From ``(stage, trained domain, {domain: accuracy})`` rows in training order.

        Columns: ``domains`` if given, else trained domains in stage order, then the others sorted.
        """
        if domains is None:
            seen = [t for _, t, _ in rows if t]
            others = sorted({d for _, _, accs in rows for d in accs} | set(base or {}))
            domains = list(dict.fromkeys(seen + others))
        cols = tuple(domains)
        return cls(
            stages=tuple(name for name, _, _ in rows),
            trained=tuple(t for _, t, _ in rows),
            domains=cols,
            values=tuple(tuple(_num(accs.get(d)) for d in cols) for _, _, accs in rows),
            base=tuple(_num(base.get(d)) for d in cols) if base is not None else None,
        )

    def at(self, stage: int, domain: str) -> float | None:
        return self.values[stage][self.domains.index(domain)]

    def average_accuracy(self) -> float | None:
        final = [v for v in self.values[-1] if v is not None]
        return mean(final) if final else None

    def bwt_terms(self) -> dict[str, float]:
        """``A[T, d] - A[i, d]`` for each domain ``d`` trained at a stage ``i`` before the last."""
        last = len(self.stages) - 1
        terms = {}
        for i, domain in enumerate(self.trained[:-1]):
            if domain in self.domains:
                now, then = self.at(last, domain), self.at(i, domain)
                if now is not None and then is not None:
                    terms[domain] = now - then
        return terms

    def fwt_terms(self) -> dict[str, float]:
        """``A[i-1, d] - base[d]`` for each domain ``d`` trained at a stage ``i`` after the first."""
        if self.base is None:
            return {}
        terms = {}
        for i, domain in enumerate(self.trained):
            if i == 0 or domain not in self.domains:
                continue
            before, base = self.at(i - 1, domain), self.base[self.domains.index(domain)]
            if before is not None and base is not None:
                terms[domain] = before - base
        return terms

    def bwt(self) -> float | None:
        terms = self.bwt_terms()
        return mean(terms.values()) if terms else None

    def fwt(self) -> float | None:
        terms = self.fwt_terms()
        return mean(terms.values()) if terms else None

    def max_forgetting(self) -> dict[str, float | None]:
        """Per trained domain, the worst drop below its just-trained accuracy at any later stage."""
        out: dict[str, float | None] = {}
        for i, domain in enumerate(self.trained):
            if domain not in self.domains:
                continue
            peak = self.at(i, domain)
            later = [self.at(k, domain) for k in range(i + 1, len(self.stages))]
            later = [v for v in later if v is not None]
            out[domain] = max(peak - v for v in later) if peak is not None and later else None
        return out

    def metrics(self) -> dict[str, Any]:
        return {
            "average_accuracy": self.average_accuracy(),
            "bwt": self.bwt(),
            "bwt_terms": self.bwt_terms(),
            "fwt": self.fwt(),
            "fwt_terms": self.fwt_terms(),
            "max_forgetting": self.max_forgetting(),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": list(self.stages),
            "trained": list(self.trained),
            "domains": list(self.domains),
            "values": [list(row) for row in self.values],
            "base": list(self.base) if self.base is not None else None,
            "metrics": self.metrics(),
        }


def _num(value: Any) -> float | None:
    return None if value is None else float(value)
