"""Token-entropy stability: which of checkpoint k's choices survive training stage k+1.

For the same prompts and responses, each analysed position (a model-written token) gets, under
checkpoint k, the entropy ``H = -sum_v p(v) log p(v)`` (nats) of the next-token distribution and its
top choice; under checkpoint k+1, its top choice. A position is *stable* when both top choices agree.
Positions are split by checkpoint k's entropy: *high* when ``H > threshold``, *low* otherwise; the
threshold is given in nats or taken as the ``1 - high_quantile`` quantile of the entropies (default:
the top 20% are high-entropy "forking" tokens, as in Wang et al. 2025, "Beyond the 80/20 Rule").

Reported per pair: the share of low-entropy tokens that stay stable (the ACLArena paper finds about
95%; docs/evaluation.md) and the share of high-entropy decision tokens that are rewritten, plus stability per
entropy bin (equal-count bins) for the plot.

From top-k log-probs only (SGLang's ``top_logprobs``), the entropy is that of the top-k tokens plus
one lumped outcome holding the remaining mass: a lower bound of the full entropy, exact when the
top-k hold all the mass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


class EntropyError(ValueError):
    pass


@dataclass(frozen=True)
class TokenStats:
    """One checkpoint's view of the analysed positions, flattened over all sequences."""

    entropy: np.ndarray  # float64, nats
    top: np.ndarray  # int64, the top-choice token id

    def __post_init__(self) -> None:
        if self.entropy.shape != self.top.shape:
            raise EntropyError("entropy and top choice must cover the same positions")

    @classmethod
    def concat(cls, parts: Sequence[TokenStats]) -> TokenStats:
        if not parts:
            return cls(np.zeros(0), np.zeros(0, dtype=np.int64))
        return cls(np.concatenate([p.entropy for p in parts]), np.concatenate([p.top for p in parts]))


def stats_from_logits(logits: Any) -> TokenStats:
    """Exact entropy and argmax from a ``[positions, vocab]`` tensor of logits (float64 for the sum)."""
    import torch

    log_p = torch.log_softmax(logits.detach().to(torch.float64), dim=-1)
    entropy = -(log_p.exp() * log_p).sum(dim=-1)
    return TokenStats(entropy.cpu().numpy(), log_p.argmax(dim=-1).cpu().numpy().astype(np.int64))


def stats_from_top_logprobs(positions: Sequence[Sequence[Sequence[Any]]]) -> TokenStats:
    """From SGLang's per-position ``[[logprob, token_id, text], ...]`` lists (top-k, any order)."""
    entropy, top = np.zeros(len(positions)), np.zeros(len(positions), dtype=np.int64)
    for i, candidates in enumerate(positions):
        if not candidates:
            raise EntropyError(f"position {i} has no top-k log-probs")
        log_probs = [float(c[0]) for c in candidates]
        probs = [math.exp(lp) for lp in log_probs]
        rest = max(0.0, 1.0 - sum(probs))
        entropy[i] = -sum(p * lp for p, lp in zip(probs, log_probs, strict=True)) - (
            rest * math.log(rest) if rest > 0 else 0.0
        )
        top[i] = int(candidates[max(range(len(candidates)), key=lambda c: log_probs[c])][1])
    return TokenStats(entropy, top)


@dataclass(frozen=True)
class PairReport:
    label: str
    n_tokens: int
    threshold: float
    n_low: int
    n_high: int
    low_stable: float | None  # percent of low-entropy tokens whose top choice is unchanged (None: no such token)
    high_rewritten: float | None  # percent of high-entropy tokens whose top choice changed
    stable: float  # percent of all tokens unchanged
    bin_entropy: list[float]  # mean entropy per equal-count bin
    bin_stable: list[float | None]  # percent unchanged per bin

    def row(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("bin_")}


def compare(
    before: TokenStats,
    after: TokenStats,
    label: str = "",
    threshold: float | None = None,
    high_quantile: float = 0.2,
    n_bins: int = 10,
) -> PairReport:
    """Stability of ``before``'s top choices under ``after`` (same positions, same order)."""
    if before.top.shape != after.top.shape:
        raise EntropyError(f"{label}: the checkpoints cover {before.top.size} and {after.top.size} positions")
    if before.top.size == 0:
        raise EntropyError(f"{label}: no positions to analyse")
    if threshold is None:
        if not 0.0 < high_quantile < 1.0:
            raise EntropyError("high_quantile must be between 0 and 1")
        threshold = float(np.quantile(before.entropy, 1.0 - high_quantile))
    same = before.top == after.top
    high = before.entropy > threshold
    order = np.argsort(before.entropy, kind="stable")
    bins = [b for b in np.array_split(order, min(n_bins, order.size)) if b.size]
    return PairReport(
        label=label,
        n_tokens=int(same.size),
        threshold=threshold,
        n_low=int((~high).sum()),
        n_high=int(high.sum()),
        low_stable=_percent(same[~high]),
        high_rewritten=_percent(~same[high]),
        stable=float(100.0 * same.mean()),
        bin_entropy=[float(before.entropy[b].mean()) for b in bins],
        bin_stable=[_percent(same[b]) for b in bins],
    )


def _percent(flags: np.ndarray) -> float | None:
    return float(100.0 * flags.mean()) if flags.size else None


def compare_chain(stats: Sequence[TokenStats], labels: Sequence[str], **kwargs: Any) -> list[PairReport]:
    """Consecutive pairs ``(k, k+1)`` of a chain of checkpoints."""
    if len(stats) < 2:
        raise EntropyError("the analysis needs at least two checkpoints")
    return [
        compare(stats[k], stats[k + 1], label=f"{labels[k]} → {labels[k + 1]}", **kwargs) for k in range(len(stats) - 1)
    ]
