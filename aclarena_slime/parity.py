"""Log-prob parity: the engine's log-probs of a rollout against the trainer's recompute of the same tokens.

Every policy-gradient ratio divides the trainer's probability by the engine's. If the two disagree by
more than numerics (a wrong adapter served, a stale version, a template or temperature mismatch,
a bad weight sync), training optimises a wrong objective silently. So the gap is measured on loss-mask
tokens, logged as one line, and a gap above the limit stops the run before it trains on it
(:class:`ParityError`); ``aclarena doctor`` measures it on demand.

A gap is the mean absolute difference per token (the maximum is reported, not gated: with bf16 a few
tokens near a tie can differ a lot while the ratio's mean is fine).
- Local backend, :data:`LOCAL_TOLERANCE` 1e-3, first batch: the local engine and trainer run the same
  float32 weights; what is left is the batch's summation order (~1e-6 on the tiny model).
- Slime (:class:`ParityGate`, settings :class:`ParitySettings`, the recipe's ``parity:``): every rollout
  is checked, per expert with parallel MLE. A fresh LoRA stage starts with B = 0 on both sides, so at
  rollout 0 every fault in the adapter path (q/k/v de-interleave, gate/up order, alpha/r, a TP gather,
  the experts' order) multiplies zero and cannot show: the first ``calibration_rollouts`` rollouts only
  log their gap (and stop above ``ceiling``, a wrong base or template), and that gap — SGLang's kernels
  against Megatron's on the same weights — calibrates the limit every later rollout must stay under:
  ``ratio`` times it, at least ``floor``, at most ``ceiling``. The adapter's own faults grow with B from
  the first rollout served from a trained adapter on, so a bad weight sync shows as a gap that leaves
  the calibrated band. ``enforce: false`` logs every gap and never stops (a first run on new hardware,
  to read the healthy gap before choosing the settings).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

log = logging.getLogger(__name__)

LOCAL_TOLERANCE = 1e-3
SLIME_TOLERANCE = 0.05  # the default ceiling: SGLang (bf16) against Megatron sits well below it when healthy


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


def compare_groups(
    engine: Sequence[Sequence[float]],
    trainer: Sequence[Sequence[float]],
    masks: Sequence[Sequence[float]],
    groups: Sequence[str],
    tolerance: float,
) -> dict[str, ParityReport]:
    """:func:`compare` per group of samples (``groups[i]``: sample i's expert), in first-seen order."""
    if len(groups) != len(engine):
        raise ValueError(f"{len(groups)} group labels for {len(engine)} samples")
    reports = {}
    for group in dict.fromkeys(groups):
        picked = [i for i, label in enumerate(groups) if label == group]
        reports[group] = compare(
            [engine[i] for i in picked], [trainer[i] for i in picked], [masks[i] for i in picked], tolerance
        )
    return reports


@dataclass
class ParitySettings:
    """The recipe's ``parity:`` (slime stages): how the engine-vs-trainer gap is calibrated and enforced."""

    ceiling: float = SLIME_TOLERANCE  # a gap above it stops at any rollout, calibration included
    ratio: float = 4.0  # after calibration: the limit is ratio x the calibrated gap ...
    floor: float = 2e-3  # ... but never below this (same kernels on both sides calibrate to ~0)
    calibration_rollouts: int = 1  # per expert, the first rollouts only logged: their largest gap calibrates
    enforce: bool = True  # false: log every rollout's gap, never stop

    def __post_init__(self) -> None:
        if not 0 < self.floor <= self.ceiling:
            raise ValueError(f"parity needs 0 < floor <= ceiling, got floor {self.floor}, ceiling {self.ceiling}")
        if self.ratio < 1:
            raise ValueError(f"parity.ratio must be >= 1 (a multiple of the calibrated gap), got {self.ratio}")
        if not isinstance(self.calibration_rollouts, int) or self.calibration_rollouts < 1:
            raise ValueError(f"parity.calibration_rollouts must be a positive integer, got {self.calibration_rollouts!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> ParitySettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values or {}) - known)
        if unknown:
            raise ValueError(f"unknown parity settings {unknown}; known: {sorted(known)}")
        return cls(**dict(values or {}))


@dataclass
class ParityGate:
    """Per expert, the gaps seen so far and the limit they calibrated; :meth:`observe` logs one rollout's gap
    and raises :class:`ParityError` when it is above the limit (and ``enforce`` is on)."""

    settings: ParitySettings = field(default_factory=ParitySettings)
    calibration: dict[str, list[float]] = field(default_factory=dict)  # expert -> gaps of its calibration rollouts

    def limit(self, group: str) -> float:
        """The largest gap ``group``'s next rollout may have."""
        s, seen = self.settings, self.calibration.get(group, [])
        if len(seen) < s.calibration_rollouts:
            return s.ceiling
        return min(s.ceiling, max(s.floor, s.ratio * max(seen)))

    def observe(self, where: str, group: str, report: ParityReport) -> str:
        """One rollout's gap for ``group``: the log line; raises past the limit. ``report`` is from :func:`compare`."""
        if report.tokens == 0:  # this expert had no loss-mask token here: nothing learned, nothing to stop
            return f"{where}{f', expert {group}' if group else ''}: no loss-mask tokens, not compared"
        limit = self.limit(group)
        calibrating = len(self.calibration.get(group, [])) < self.settings.calibration_rollouts
        checked = ParityReport(report.samples, report.tokens, report.mean_abs, report.max_abs, limit)
        stage = "calibrating" if calibrating else "calibrated"
        label = f"{where}{f', expert {group}' if group else ''}: {checked.line()} [{stage}]"
        if calibrating:
            self.calibration.setdefault(group, []).append(report.mean_abs)
        if checked.ok or not self.settings.enforce:
            log.info(label)
            return label
        why = "the trainer would train on a mismatch"
        seen = self.calibration.get(group)
        source = f"calibrated on {', '.join(f'{g:.3g}' for g in seen)}" if seen and not calibrating else "the ceiling"
        raise ParityError(f"{label}: {why} (limit from {source}; parity settings: {self.settings})")
