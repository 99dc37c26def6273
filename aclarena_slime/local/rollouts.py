"""Rollouts and evaluations of the local backend's loops: GRPO groups (with the recipe's dynamic sampling),
held-out and validation evaluations, each sample seeded by its number so runs reproduce, and the figures a step
records."""

from __future__ import annotations

import asyncio
import functools
import statistics
from typing import Any

from aclarena_slime.evaluation.suite import HELD_OUT_SEED
from aclarena_slime.local.group_filter import PromptStream, SampledStep, sample_groups
from aclarena_slime.local.parts import Sampling, StepSampling
from aclarena_slime.local.records import Sample, StageRecords, new_sample
from aclarena_slime.local.trainer import TrainSample
from aclarena_slime.rollout import RolloutContext, run_sample, score_sample


async def rollout_step(
    context: RolloutContext,
    records: list[dict[str, Any]],
    step: StepSampling,
    number: int,
    seed: int,
    limit: asyncio.Semaphore,
) -> list[Sample]:
    """The rollouts of each record (one GRPO group per record, numbered from step ``number``'s first), rewarded."""
    numbered = [(number * step.prompts_per_step + g, record) for g, record in enumerate(records)]
    return [s for group in await rollout_groups(context, numbered, step.groups, seed, limit) for s in group]


async def rollout_groups(
    context: RolloutContext,
    numbered: list[tuple[int, dict[str, Any]]],
    sampling: Sampling,
    seed: int,
    limit: asyncio.Semaphore,
) -> list[list[Sample]]:
    """One GRPO group of ``sampling.samples`` rewarded rollouts per ``(group number, record)``; sample ``k`` of
    group ``g`` is sample ``g * samples + k`` of the stage (drawn from the stage's ``seed``)."""
    k = sampling.samples
    groups = [[new_sample(record, g, g * k + j) for j in range(k)] for g, record in numbered]
    await _gather(context, [s for group in groups for s in group], sampling.request(), seed, limit)
    return groups


async def sample_step(
    context: RolloutContext, stream: PromptStream, step: StepSampling, seed: int, limit: asyncio.Semaphore
) -> SampledStep:
    """A GRPO step's groups (:class:`StepSampling`)."""
    return await sample_groups(
        stream,
        functools.partial(rollout_groups, context, sampling=step.groups, seed=seed, limit=limit),
        step.prompts_per_step,
        step.prompts_per_round,
        step.group_filter,
        step.max_rounds,
    )


async def evaluate(
    context: RolloutContext,
    records: list[dict[str, Any]],
    sampling: Sampling,
    seed: int,
    limit: asyncio.Semaphore,
    greedy: bool = False,
) -> dict[str, Any]:
    """Mean reward of ``sampling.samples`` rollouts per held-out record (avg@n; greedy at temperature 0), or with
    ``greedy`` of one greedy rollout per record. Sample ``j`` of record ``i`` has its own seed, the same whatever
    the policy, so two evaluations of one stage differ by the policy, not by the draw; the draw is the stage's
    ``seed`` moved by :data:`~aclarena_slime.evaluation.suite.HELD_OUT_SEED`, apart from training's."""
    k = 1 if greedy else sampling.samples
    params = sampling.request(greedy)
    how = {"temperature": params["temperature"], "top_p": params["top_p"]}
    if not records:
        return {"n": 0, "mean_reward": None, "excluded": 0, "prompts": 0, "samples_per_prompt": k, **how}
    samples = [new_sample(r, i, i * k + j) for i, r in enumerate(records) for j in range(k)]
    await _gather(context, samples, params, seed + HELD_OUT_SEED, limit)
    usable = [s for s in samples if s.usable]
    mean = statistics.fmean(s.reward for s in usable) if usable else None
    return {"n": len(usable), "mean_reward": mean, "excluded": len(samples) - len(usable), "prompts": len(records),
            "samples_per_prompt": k, **how}  # fmt: skip  (how it was measured: the stage line says it)


def in_stage(records: StageRecords, stage_eval: bool) -> list[dict[str, Any]]:
    """The held-out records the stage evaluates itself: none with ``stage_eval`` off (the arena's evaluator
    measures the stage's policy afterwards; the records stay out of training all the same)."""
    return records.evaluation if stage_eval else []


async def validate(
    context: RolloutContext,
    records: list[dict[str, Any]],
    sampling: Sampling,
    seed: int,
    limit: asyncio.Semaphore,
    step: int,
) -> dict[str, Any]:
    """The reward on the validation prompts after ``step`` GRPO steps, evaluated as the held-out prompts are: what
    settings are chosen on."""
    return {"step": step, **await evaluate(context, records, sampling, seed, limit)}


async def _gather(
    context: RolloutContext, samples: list[Sample], params: dict[str, Any], seed: int, limit: asyncio.Semaphore
) -> None:
    """Roll out and score ``samples``; requests enter the engine in sample order, each with its own seed,
    so a run is reproducible whatever order the engine finishes them in."""

    async def one(sample: Sample) -> None:
        async with limit:
            await run_sample(context, sample, {**params, "sampling_seed": seed * 1_000_003 + int(sample.index or 0)})
            if sample.usable:
                sample.reward = await score_sample(context, sample)

    await asyncio.gather(*(one(s) for s in samples))


def step_line(step: dict[str, Any]) -> str:
    """One GRPO step's diagnostics on one line: what the rollouts scored, whether there was anything to
    learn from (groups with differing rewards), and how far the step moved the policy."""
    return (
        f"step {step['step']}: reward {step['reward_mean']:.3f}, groups with spread {step['groups_with_spread']:.2f}, "
        f"adv std {step['adv_std']:.2f}, entropy {step.get('entropy', 0.0):.2f}, "
        f"KL to start {step.get('kl_to_start', 0.0):.4f}, grad norm {step.get('grad_norm', 0.0):.2f}, "
        f"clip {step['clip_frac']:.3f}, truncated {step['truncated_frac']:.2f}"
    )


def to_train_sample(sample: Sample) -> TrainSample:
    return TrainSample(
        tokens=list(sample.tokens),
        response_length=sample.response_length,
        loss_mask=list(sample.loss_mask or []),
        rollout_log_probs=list(sample.rollout_log_probs or []),
        reward=float(sample.reward or 0.0),
        group=int(sample.group_index or 0),
    )


def rollout_figures(samples: list[Sample]) -> dict[str, float]:
    usable = [s for s in samples if s.usable]
    rewards = [float(s.reward or 0.0) for s in usable]
    return {
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "response_len_mean": statistics.fmean(s.response_length for s in usable) if usable else 0.0,
        "model_token_frac": sum(sum(s.loss_mask or []) for s in usable)
        / max(sum(s.response_length for s in usable), 1),
        "truncated_frac": sum(s.status is Sample.Status.TRUNCATED for s in usable) / max(len(usable), 1),
        "excluded": float(len(samples) - len(usable)),
    }


def progress_bar(enabled: bool) -> Any:
    """The stage's one progress bar (on stderr: stdout is for results), or none."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not enabled,
        transient=False,
        console=Console(stderr=True),  # stdout is for results (``--json``)
    )
