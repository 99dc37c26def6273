"""Run-time guards over what the rollouts produce: a run that trains on nothing, or refills one batch for ever,
stops and says why.

Two failures that neither slime nor the env reports (issue 44): when an env service dies, every episode
ends aborted, its sample is removed (never trained on), and the stage goes on training zero-loss steps to a
"successful" end; and when every group scores alike (a dead user simulator, a model that never calls the
tool) the group filter drops every group and slime's dynamic-sampling loop
(``slime/rollout/sglang_rollout.py`` ``generate_rollout_async``, 624b824) refills the batch with no cap.

- :class:`RolloutHealth` reads each batch (the reward post-process hook sees it whole; on a rollout-only run,
  which slime ends before the post-process, its rollout-log hook does): a batch in
  which more than ``max_lost_fraction`` of the samples were removed or aborted is logged at WARNING with the
  counts and the reasons; ``max_bad_rollouts`` such batches in a row raise :class:`RolloutsLost`.
- :class:`RefillBound` sits behind the group filter, which slime calls once per finished group: more than
  ``max_refill_rounds`` rounds' worth of groups dropped in a row raise :class:`RefillExhausted`. Every paper
  recipe's filter is ours for this reason (the math and IF stages' is slime's rule, ``reward_nonzero_std``).

Either error ends slime's rollout, so the Ray job fails with the message. The settings are a recipe's
``custom.aclarena_guards`` (:class:`~aclarena_slime.group_rewards.GuardSettings`, beside the filters' own).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aclarena_slime.agent_loop import ABORTED, FAILED
from aclarena_slime.group_rewards import GuardSettings
from aclarena_slime.rollout import RECORD_KEY

log = logging.getLogger(__name__)


class RolloutsLost(RuntimeError):
    """Several rollouts in a row lost most of their samples: the run would train on (or, rollout-only, dump) nothing."""


class RefillExhausted(RuntimeError):
    """The group filter dropped every group for too many rounds: slime would refill the batch for ever."""


def lost_reason(sample: Any) -> str | None:
    """Why a sample is not trained on (the rollout's end reason, e.g. ``env_aborted``), or None if it is."""
    status = getattr(getattr(sample, "status", None), "value", getattr(sample, "status", None))
    if not sample.remove_sample and status not in (ABORTED, FAILED):
        return None
    metadata = sample.metadata if isinstance(sample.metadata, Mapping) else {}
    record = metadata.get(RECORD_KEY) or {}
    return str(record.get("end") or status or "removed")


def _example_error(samples: Sequence[Any]) -> str | None:
    for sample in samples:
        metadata = sample.metadata if isinstance(sample.metadata, Mapping) else {}
        error = (metadata.get(RECORD_KEY) or {}).get("error")
        if error:
            return str(error)[:300]
    return None


@dataclass
class RolloutHealth:
    """The training batches of one run, one :meth:`observe` each, in order."""

    settings: GuardSettings = field(default_factory=GuardSettings)
    rollouts: int = 0
    bad_in_a_row: int = 0

    def observe(self, samples: Sequence[Any]) -> str | None:
        """Check one batch: the alarm (also logged at WARNING), or None; raises :class:`RolloutsLost` at the
        ``max_bad_rollouts``-th alarmed batch in a row."""
        self.rollouts += 1
        reasons = Counter(r for r in map(lost_reason, samples) if r is not None)
        lost = sum(reasons.values())
        if not samples or lost <= self.settings.max_lost_fraction * len(samples):
            self.bad_in_a_row = 0
            return None
        self.bad_in_a_row += 1
        detail = ", ".join(f"{reason} {count}" for reason, count in reasons.most_common())
        alarm = (
            f"rollout {self.rollouts}: {lost} of {len(samples)} samples removed or aborted ({detail}), more than "
            f"{self.settings.max_lost_fraction:.0%}; {self.bad_in_a_row} such rollout(s) in a row"
        )
        example = _example_error(samples)
        if example:
            alarm += f"; e.g. {example}"
        log.warning("%s", alarm)
        limit = self.settings.max_bad_rollouts
        if limit and self.bad_in_a_row >= limit:
            raise RolloutsLost(
                f"{alarm}. Stopping: {limit} rollouts in a row lost most of their samples, so the run would train on "
                "(or, rollout-only, dump) nothing (custom.aclarena_guards.max_bad_rollouts); check the env's services"
            )
        return alarm


@dataclass
class RefillBound:
    """Counts the groups a filter drops in a row (slime calls the filter once per finished group)."""

    settings: GuardSettings = field(default_factory=GuardSettings)
    round_size: int = 1  # groups slime asks for per refill round
    dropped_in_a_row: int = 0
    reasons: Counter = field(default_factory=Counter)

    def judged(self, keep: bool, reason: str | None) -> None:
        """Record one group's verdict; raises :class:`RefillExhausted` past ``max_refill_rounds`` rounds."""
        if keep:
            self.dropped_in_a_row = 0
            self.reasons.clear()
            return
        self.dropped_in_a_row += 1
        self.reasons[reason or "dropped"] += 1
        rounds = self.settings.max_refill_rounds
        if rounds and self.dropped_in_a_row >= rounds * max(self.round_size, 1):
            detail = ", ".join(f"{r} {n}" for r, n in self.reasons.most_common())
            raise RefillExhausted(
                f"the group filter dropped {self.dropped_in_a_row} groups in a row ({detail}), {rounds} rounds of "
                f"{self.round_size} without keeping one: slime's dynamic sampling would refill this batch for ever "
                "(custom.aclarena_guards.max_refill_rounds); check the env's services (a dead user simulator scores "
                "every sample alike) and whether the model does what the filter asks"
            )
