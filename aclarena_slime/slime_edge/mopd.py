"""MOPD hooks: the teacher of each sample's env tag fills ``teacher_log_probs`` (:mod:`aclarena_slime.distill.mopd`).

They read ``args.aclarena_mopd`` (the recipe's ``custom.aclarena_mopd``), slime's ``--rm-url`` (the
teacher pool when none is set), ``--rollout-temperature`` and ``reward_key``; the teacher table is built
once per ``args``, and the teachers are reached on the rollout context's HTTP session.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aclarena_slime import group_rewards
from aclarena_slime.distill import mopd
from aclarena_slime.rollout import env_tag, score_sample
from aclarena_slime.slime_edge import custom
from aclarena_slime.slime_edge.rollout import group_normalization, rollout_context, rollout_health

_tables: tuple[Any, mopd.TeacherTable] | None = None  # (args, its table): one run per process


def _teachers(args: Any) -> mopd.TeacherTable:
    global _tables
    if _tables is None or _tables[0] is not args:
        _tables = (args, mopd.TeacherTable.from_settings(custom.mopd(args), getattr(args, "rm_url", None)))
    return _tables[1]


async def teacher_log_probs_reward(args: Any, sample: Any, **_: Any) -> float | list[float]:
    """slime ``--custom-rm-path``: fill ``sample.teacher_log_probs``; return the task reward (default 0.0).

    With ``--group-rm`` slime passes a list of samples and gets a list back. A sample whose teacher
    failed is aborted and removed; its 0.0 is bookkeeping only (slime's rollout metrics round every
    reward, so None would crash them) and :func:`mopd_post_process` leaves it out of its group's baseline.
    """
    if isinstance(sample, list):
        return list(await asyncio.gather(*(teacher_log_probs_reward(args, one) for one in sample)))
    settings = custom.mopd(args)
    teacher = _teachers(args).for_tag(env_tag(sample))
    temperature = settings.teacher_temperature
    if temperature is None:
        temperature = getattr(args, "rollout_temperature", 1.0)
    context = await rollout_context(args)
    if not await mopd.fill_teacher_log_probs(context.client(teacher.url), teacher, sample, float(temperature)):
        return 0.0
    if settings.task_reward:
        return await score_sample(context, sample)
    return 0.0


def mopd_post_process(args: Any, samples: list[Any], **_: Any) -> tuple[list[float], list[float]]:
    """slime ``--custom-reward-post-process-path``: ``(raw_rewards, rewards)``, teacher log-probs guaranteed.

    Rewards are group-normalized as slime does for GRPO-style estimators, over the kept samples only
    (a dropped sample must not shift its group's baseline); dropped samples get 0.0. A batch that lost most of
    its samples (a dead teacher or env service) raises the alarm, as ``reward_post_process`` does.
    """
    rollout_health(args).observe(samples)
    raw = mopd.raw_rewards(samples, getattr(args, "reward_key", None))
    return raw, group_rewards.normalized_rewards(samples, raw, group_normalization(args))
