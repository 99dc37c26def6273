"""The forgetting monitor's settings and its alarm: plain logic, no I/O, no model.

While stage k trains, every ``interval`` rollouts, every earlier domain is evaluated (the local
backend: :mod:`aclarena_slime.evaluation.monitor`; slime: the stage's ``--eval-config``). The first
score of a domain in the stage is its baseline (the policy the stage started from); a domain whose
score falls more than ``max_drop`` points below that baseline raises an alarm, once per domain.
``action`` says what the stage does then: ``warn`` (log and metrics only), ``keep`` (also keep the
policy of the last check before the fall) or ``stop`` (end the stage there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

ACTIONS = ("warn", "keep", "stop")


class MonitorError(ValueError):
    """A monitor setting that cannot work; the message names it."""


@dataclass
class MonitorSettings:
    """The ``monitor:`` section of a curriculum (copied into each stage that has earlier domains)."""

    enabled: bool = False
    interval: int = 1  # rollouts between two checks (slime: --eval-interval)
    max_drop: float = 5.0  # accuracy points below the stage's starting score that raise the alarm
    action: str = "warn"  # warn | keep | stop
    # Eval suite with the earlier domains' datasets (relative to the curriculum file). None: each earlier
    # env's generated demo records (``demo_size`` of them) — the local backend only; slime needs data files.
    suite: str | None = None
    services: dict[str, str] = field(default_factory=dict)  # the suite's ``services`` (e.g. retriever_url)
    demo_size: int = 8
    max_response_len: int = 64  # token budget of a demo-record check
    # env tag -> settings merged over each checked dataset's env settings; ``{local_engine}`` and
    # ``{local_model}`` name the stage's engine (e.g. a user simulator served by it)
    env_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.interval, int) or isinstance(self.interval, bool) or self.interval < 1:
            raise MonitorError(f"monitor.interval must be a positive integer, got {self.interval!r}")
        if self.max_drop < 0:
            raise MonitorError(f"monitor.max_drop must be >= 0 (accuracy points), got {self.max_drop!r}")
        if self.action not in ACTIONS:
            raise MonitorError(f"monitor.action must be one of {', '.join(ACTIONS)}, got {self.action!r}")
        if self.demo_size < 1 or self.max_response_len < 1:
            raise MonitorError("monitor.demo_size and monitor.max_response_len must be positive")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> MonitorSettings:
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise MonitorError(f"unknown monitor settings: {', '.join(unknown)}")
        return cls(**dict(values))


@dataclass(frozen=True)
class Alarm:
    domain: str
    step: int  # the rollout after which the fall was seen
    baseline: float
    score: float
    kept_step: int | None  # the last check before the fall (the policy ``keep`` saves)

    @property
    def drop(self) -> float:
        return self.baseline - self.score

    def message(self) -> str:
        return (
            f"forgetting alarm: {self.domain} fell {self.drop:.1f} points "
            f"({self.baseline:.1f} -> {self.score:.1f}) by rollout {self.step}"
        )


@dataclass
class ForgettingMonitor:
    """Per-domain curves of one stage and the alarms raised on them."""

    settings: MonitorSettings
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    alarms: list[Alarm] = field(default_factory=list)
    last_quiet_step: int | None = None  # the last check at which no domain had fallen
    last_step: int | None = None

    def due(self, step: int) -> bool:
        """Check after rollout ``step`` (0 = before the first one: the baseline)."""
        return step % self.settings.interval == 0

    def baseline(self, domain: str) -> float | None:
        curve = self.curves.get(domain)
        return curve[0][1] if curve else None

    def observe(self, step: int, scores: Mapping[str, float]) -> list[Alarm]:
        """Record ``scores`` (domain -> accuracy in points) seen after rollout ``step``; return new alarms."""
        if self.last_step is not None and step <= self.last_step:
            raise MonitorError(f"monitor steps must increase; got {step} after {self.last_step}")
        self.last_step = step
        new: list[Alarm] = []
        fallen = {a.domain for a in self.alarms}
        for domain, score in scores.items():
            curve = self.curves.setdefault(domain, [])
            curve.append((step, float(score)))
            base = curve[0][1]
            if domain not in fallen and base - float(score) > self.settings.max_drop:
                new.append(Alarm(domain, step, base, float(score), self.last_quiet_step))
        if not new and not fallen:
            self.last_quiet_step = step
        self.alarms += new
        return new

    @property
    def should_stop(self) -> bool:
        return self.settings.action == "stop" and bool(self.alarms)

    def to_dict(self) -> dict[str, Any]:
        """What goes into the stage's metrics (and the curriculum manifest, for the report's plot)."""
        return {
            "settings": self.settings.to_dict(),
            "curves": {d: [[s, v] for s, v in c] for d, c in self.curves.items()},
            "alarms": [{**asdict(a), "drop": round(a.drop, 3)} for a in self.alarms],
            "stopped": self.should_stop,
        }
