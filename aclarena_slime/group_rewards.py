"""Group-normalized rewards (the GRPO baseline) over the samples that are kept for training.

slime's own ``_post_process_rewards`` (``slime/ray/rollout.py``) subtracts each group's mean reward
(and divides by its std for GRPO-style estimators) over every sample of the group. A sample that is
removed (``remove_sample``: an env service or a teacher failed on it) carries only a placeholder
reward, and letting it into its group's mean and std would shift every other sample's advantage.
Here removed samples are left out of their group's statistics and get 0.0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

NORMALIZED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")  # slime's group-norm set
STD_ESTIMATORS = ("grpo", "gspo", "cispo")  # slime also divides by the group's std for these


def reward_value(args: Any, sample: Any) -> float:
    """slime's ``Sample.get_reward_value``: ``reward``, or ``reward[args.reward_key]`` when a key is set.

    A removed sample with no number (its reward function never ran) counts as 0.0: it is never trained on.
    """
    value = sample.reward
    key = getattr(args, "reward_key", None)
    if key and isinstance(value, Mapping):
        value = value[key]
    if sample.remove_sample and not isinstance(value, (int, float)):
        return 0.0
    return float(value)


def normalized_rewards(args: Any, samples: Sequence[Any], raw: Sequence[float]) -> list[float]:
    """Per-sample training rewards from ``raw``, normalized per group as slime does, kept samples only.

    Reads slime's ``advantage_estimator``, ``rewards_normalization``, ``grpo_std_normalization`` and
    ``n_samples_per_prompt``. Groups are ``sample.group_index``, or runs of ``n_samples_per_prompt``
    samples where it is unset. Removed samples get 0.0 whatever the estimator.
    """
    estimator = getattr(args, "advantage_estimator", "grpo")
    if estimator not in NORMALIZED_ESTIMATORS or not getattr(args, "rewards_normalization", True):
        return [0.0 if sample.remove_sample else float(r) for sample, r in zip(samples, raw, strict=True)]
    use_std = estimator in STD_ESTIMATORS and getattr(args, "grpo_std_normalization", True)
    size = int(getattr(args, "n_samples_per_prompt", 1) or 1)
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
