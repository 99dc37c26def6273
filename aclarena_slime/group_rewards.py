"""Group-normalized rewards (the GRPO baseline) over the samples kept for training, and group filters.

slime's own ``_post_process_rewards`` (``slime/ray/rollout.py``) subtracts each group's mean reward
(and divides by its std for GRPO-style estimators) over every sample of the group. A sample that is
removed (``remove_sample``: an env service or a teacher failed on it) carries only a placeholder
reward, and letting it into its group's mean and std would shift every other sample's advantage.
Here removed samples are left out of their group's statistics and get 0.0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aclarena_slime.rollout import RECORD_KEY

NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")  # slime's group-norm set
STD_ESTIMATORS = ("grpo", "gspo", "cispo")  # slime also divides by the group's std for these


@dataclass(frozen=True)
class GroupNormalization:
    """How slime normalizes rewards within a group (its ``advantage_estimator``, ``rewards_normalization``,
    ``grpo_std_normalization`` and ``n_samples_per_prompt``)."""

    estimator: str = "grpo"
    enabled: bool = True
    std: bool = True
    group_size: int = 1


def reward_value(sample: Any, reward_key: str | None = None) -> float:
    """slime's ``Sample.get_reward_value``: ``reward``, or ``reward[reward_key]`` when a key is set.

    A removed sample with no number (its reward function never ran) counts as 0.0: it is never trained on.
    """
    value = sample.reward
    if reward_key and isinstance(value, Mapping):
        value = value[reward_key]
    if sample.remove_sample and not isinstance(value, (int, float)):
        return 0.0
    return float(value)


def normalized_rewards(samples: Sequence[Any], raw: Sequence[float], norm: GroupNormalization) -> list[float]:
    """Per-sample training rewards from ``raw``, normalized per group as slime does, kept samples only.

    Groups are ``sample.group_index``, or runs of ``norm.group_size`` samples where it is unset.
    Removed samples get 0.0 whatever the estimator.
    """
    if norm.estimator not in NORMALIZED_ESTIMATORS or not norm.enabled:
        return [0.0 if sample.remove_sample else float(r) for sample, r in zip(samples, raw, strict=True)]
    use_std = norm.estimator in STD_ESTIMATORS and norm.std
    size = max(int(norm.group_size or 1), 1)
    groups: dict[Any, list[int]] = {}
    for i, sample in enumerate(samples):
        key = sample.group_index if sample.group_index is not None else i // size
        groups.setdefault(key, []).append(i)
    out = [0.0] * len(raw)
    for members in groups.values():
        kept = [i for i in members if not samples[i].remove_sample]
        if not kept:
            continue
        mean = sum(raw[i] for i in kept) / len(kept)
        std = math.sqrt(sum((raw[i] - mean) ** 2 for i in kept) / (len(kept) - 1)) if len(kept) > 1 else 0.0
        for i in kept:
            out[i] = (raw[i] - mean) / (std + 1e-6) if use_std else raw[i] - mean
    return out


# --------------------------------------------------------------------------- group filters
# Behind slime's ``--dynamic-sampling-filter-path`` (the adapters are in aclarena_slime.slime_edge.rollout):
# each judges one prompt's group before it enters the batch and returns ``(keep, reason)``. They read the
# env's score breakdown that the rollout records in each sample's metadata, under keys any env may report:
# ``tool_calls`` (tool calls the env ran for the model) and ``task_reward`` (the task outcome before any
# shaping). Their settings are a recipe's ``custom.aclarena_filters`` (:class:`FilterSettings`).


@dataclass
class FilterSettings:
    """The group filters' settings; defaults are the ACLArena authors'.

    ``max_no_tool_fraction``: mask a group's no-tool samples only where strictly more than this fraction
    of it never called a tool (``slime/examples/search-r1/no_tool_loss_mask_filter.py:21``, 0.3).
    """

    max_no_tool_fraction: float = 0.3

    def __post_init__(self) -> None:
        value = self.max_no_tool_fraction
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"aclarena_filters.max_no_tool_fraction must be a number in [0, 1], got {value!r}")


@dataclass
class GuardSettings:
    """When a run stops for what its rollouts produce (a recipe's ``custom.aclarena_guards``, applied by
    :mod:`aclarena_slime.rollout_guard`); the defaults stop a dead run within minutes of rollouts and leave a
    healthy one alone.

    ``max_lost_fraction``: a training batch in which more than this fraction of the samples was removed (an env
    or its service failed) or aborted raises the alarm. ``max_bad_rollouts``: that many alarmed batches in a
    row stop the job (0: alarms only). ``max_refill_rounds``: the group filter stops the job once this many
    rounds of groups (``over_sampling_batch_size``, else ``rollout_batch_size`` groups a round) were dropped in
    a row without one kept (0: no bound).
    """

    max_lost_fraction: float = 0.5
    max_bad_rollouts: int = 3
    max_refill_rounds: int = 10

    def __post_init__(self) -> None:
        fraction = self.max_lost_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
            raise ValueError(f"aclarena_guards.max_lost_fraction must be a number in [0, 1), got {fraction!r}")
        for name in ("max_bad_rollouts", "max_refill_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"aclarena_guards.{name} must be an integer >= 0, got {value!r}")


def score_breakdown(sample: Any) -> Mapping[str, Any] | None:
    """The breakdown ``generate`` recorded for the sample's score; None when it was never scored."""
    metadata = sample.metadata if isinstance(sample.metadata, Mapping) else {}
    score = (metadata.get(RECORD_KEY) or {}).get("score") or {}
    breakdown = score.get("breakdown")
    return breakdown if isinstance(breakdown, Mapping) else None


def no_tool_mask(tool_calls: Sequence[int | None], max_no_tool_fraction: float) -> tuple[bool, list[bool]]:
    """The authors' no-tool rule for one group: ``(keep the group, mask this sample's loss)`` per sample.

    ``None`` marks a sample that is not trained on anyway (removed): it counts as neither. Where more
    than ``max_no_tool_fraction`` of the group made no tool call, those samples' losses are masked (their
    rewards still count in the group baseline); a group where none made one is dropped
    (no_tool_loss_mask_filter.py:36-51).
    """
    counted = [calls for calls in tool_calls if calls is not None]
    no_tool = [calls is not None and calls == 0 for calls in tool_calls]
    if not counted or sum(no_tool) / len(counted) <= max_no_tool_fraction:
        return True, [False] * len(tool_calls)
    if all(calls == 0 for calls in counted):
        return False, no_tool
    return True, no_tool


def drop_no_tool(samples: list[Any], max_no_tool_fraction: float) -> tuple[bool, str | None]:
    """The authors' filter of samples that never called a tool: ``(keep the group, why not)``.

    Masks the loss of a group's no-tool samples where they are more than ``max_no_tool_fraction`` of it,
    and drops a group where no sample called a tool. The env must report ``tool_calls`` in its breakdown.
    """
    counts: list[int | None] = []
    for sample in samples:
        breakdown = score_breakdown(sample)
        if sample.remove_sample:
            counts.append(None)
        elif breakdown is None or not isinstance(breakdown.get("tool_calls"), int):
            raise ValueError(
                "drop_no_tool needs each sample's score breakdown to report 'tool_calls' (an int); "
                f"got {dict(breakdown) if breakdown else breakdown!r}"
            )
        else:
            counts.append(breakdown["tool_calls"])
    keep, masked = no_tool_mask(counts, max_no_tool_fraction)
    for sample, mask in zip(samples, masked, strict=True):
        if mask:
            sample.loss_mask = [0] * len(sample.loss_mask or [0] * sample.response_length)
    return keep, None if keep else "all_no_tool"


def reward_nonzero_std(samples: list[Any], reward_key: str | None = None) -> tuple[bool, str | None]:
    """slime's built-in ``check_reward_nonzero_std`` rule (the math and IF stages' filter, run by
    ``slime_edge.rollout.reward_nonzero_std`` behind the refill bound, and by the local stage): keep a group only
    if the (unbiased) standard deviation of its samples' rewards exceeds 1e-6: ``(keep the group, why not)``."""
    values = [reward_value(sample, reward_key) for sample in samples]
    if len(values) < 2:
        return False, "too_few_samples"
    keep = _varies(values)
    return keep, None if keep else f"zero_std_{round(values[0], 1)}"


def task_reward_nonzero_std(samples: list[Any], reward_key: str | None = None) -> tuple[bool, str | None]:
    """Keep a group only if its task outcomes differ: ``(keep the group, why not)``.

    Reads the breakdown's ``task_reward`` (the outcome before shaping penalties) where the env reports
    one, else the reward, as the authors' ``check_raw_task_reward_nonzero_std`` does (their slime fork,
    ``slime/rollout/filter_hub/dynamic_sampling_filters.py:18-38``): with penalties on, shaped rewards
    almost never tie even when every sample failed the task. Removed samples (env failures) carry
    placeholder rewards and are left out; a group with fewer than two others is dropped.
    """
    values = []
    for sample in samples:
        if sample.remove_sample:
            continue
        breakdown = score_breakdown(sample) or {}
        task = breakdown.get("task_reward")
        values.append(float(task) if isinstance(task, (int, float)) else reward_value(sample, reward_key))
    if len(values) < 2:
        return False, "too_few_kept"
    keep = _varies(values)
    return keep, None if keep else f"task_zero_std_{round(values[0], 1)}"


def _varies(values: Sequence[float]) -> bool:
    """The group filters' test, slime's: the unbiased standard deviation of two or more values exceeds 1e-6."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) > 1e-6
