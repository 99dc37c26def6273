"""Log-prob parity: the engine's log-probs of a rollout against the trainer's recompute of the same tokens.

Every policy-gradient ratio divides the trainer's probability by the engine's. If the two disagree by
more than numerics (a wrong adapter served, a stale version, a template or temperature mismatch,
a bad weight sync), training optimises a wrong objective silently. So at step 0, and on demand
(``aclarena doctor``), the gap is measured on loss-mask tokens, logged as one line, and a gap above
the tolerance stops the run before it trains on it (:class:`ParityError`).

Tolerances, on the mean absolute gap per token (the maximum is reported, not gated: with bf16 a few
tokens near a tie can differ a lot while the ratio's mean is fine):
- :data:`LOCAL_TOLERANCE` 1e-3: the local engine and trainer run the same float32 weights; what is left
  is the batch's summation order (~1e-6 on the tiny model).
- :data:`SLIME_TOLERANCE` 0.05: SGLang (bf16, its kernels) against Megatron's recompute; a healthy run
  sits well below it (slime's ``train/..._log_probs`` metrics show the same quantity), a wrong adapter
  or template far above.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

LOCAL_TOLERANCE = 1e-3
SLIME_TOLERANCE = 0.05


class ParityError(RuntimeError):
    """The engine's and the trainer's log-probs disagree beyond the tolerance: do not train on them."""


@dataclass(frozen=True)
class ParityReport:
    samples: int
    tokens: int
    mean_abs: float
    max_abs: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.tokens > 0 and self.mean_abs <= self.tolerance

    def line(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        return (
            f"log-prob parity {verdict}: engine vs trainer over {self.tokens} tokens of {self.samples} samples, "
            f"mean |gap| {self.mean_abs:.3g} (tolerance {self.tolerance:g}), max {self.max_abs:.3g}"
        )


def compare(
    engine: Sequence[Sequence[float]],
    trainer: Sequence[Sequence[float]],
    masks: Sequence[Sequence[float]],
    tolerance: float,
) -> ParityReport:
    """Per sample, the engine's and the trainer's log-probs of the response tokens and the loss mask."""
    if not len(engine) == len(trainer) == len(masks):
        raise ValueError(f"{len(engine)} engine, {len(trainer)} trainer and {len(masks)} mask rows")
    total = peak = 0.0
    tokens = 0
    for i, (e, t, m) in enumerate(zip(engine, trainer, masks, strict=True)):
        if not len(e) == len(t) == len(m):
            raise ValueError(f"sample {i}: {len(e)} engine, {len(t)} trainer and {len(m)} mask values")
        for a, b, keep in zip(e, t, m, strict=True):
            if keep:
                gap = abs(float(a) - float(b))
                total, peak, tokens = total + gap, max(peak, gap), tokens + 1
    return ParityReport(len(engine), tokens, total / tokens if tokens else 0.0, peak, tolerance)


def require(report: ParityReport) -> ParityReport:
    """Log the report; raise :class:`ParityError` unless it passed (no tokens to compare is a failure too)."""
    if report.ok:
        log.info(report.line())
        return report
    why = "no loss-mask tokens to compare" if report.tokens == 0 else "the trainer would train on a mismatch"
    raise ParityError(f"{report.line()}: {why}")
