"""Dynamic sampling on the local backend: the recipe's group filter and over-sampling, as slime runs them.

slime (``generate_rollout_async`` in ``slime/rollout/sglang_rollout.py``) rolls out
``over_sampling_batch_size`` prompts at a time (``rollout_batch_size`` when unset), drops each finished group
the ``--dynamic-sampling-filter-path`` rejects, and samples more prompts until ``rollout_batch_size`` groups
are kept; what is still in flight then is aborted and its prompts are spent. The authors run it for math and
IFEval (``check_reward_nonzero_std``, 512 prompts at a time for 256), retail (the task-reward rule) and search
(the no-tool rule): a GRPO step then trains on groups that carry a signal, where an unfiltered step's token
mean is diluted by every group whose samples all scored the same.

The local stage runs the same rule in rounds, so a run is reproducible: a round rolls out the next
``over_sampling_batch_size`` prompts of the stage's stream, the filter judges the groups in prompt order, and
the first kept ones fill the step; groups kept past the batch are dropped, as slime's abort drops what
finishes late. slime samples until the batch is full; a local step stops after ``max_sampling_rounds``
rounds and trains on the groups it has (a tiny model whose groups all score alike would otherwise sample for
ever). slime's built-in filter cannot be imported here: the local stage runs the same rule from
:mod:`aclarena_slime.group_rewards`, as it runs this project's own filters.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aclarena_slime import group_rewards
from aclarena_slime.sample import Sample

# The filters the local stage runs, by the dotted path a recipe names them with: (samples, settings) -> (keep,
# why not). ``settings`` is the recipe's custom.aclarena_filters.
_RULES: dict[str, Callable[[list[Sample], group_rewards.FilterSettings], tuple[bool, str | None]]] = {
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std": lambda samples, _: (
        group_rewards.reward_nonzero_std(samples)
    ),
    "aclarena_slime.slime_edge.rollout.task_reward_nonzero_std": lambda samples, _: (
        group_rewards.task_reward_nonzero_std(samples)
    ),
    "aclarena_slime.slime_edge.rollout.drop_no_tool": lambda samples, settings: group_rewards.drop_no_tool(
        samples, settings.max_no_tool_fraction
    ),
    # slime's check_reward_nonzero_std rule behind our refill bound (the math and IF recipes' filter)
    "aclarena_slime.slime_edge.rollout.reward_nonzero_std": lambda samples, _: group_rewards.reward_nonzero_std(samples),
}
FILTER_PATHS = tuple(_RULES)


class GroupFilterError(ValueError):
    """A dynamic-sampling setting the local stage cannot run (the message names it)."""


@dataclass(frozen=True)
class GroupFilter:
    """The recipe's group filter, ready to judge a group of samples of one prompt."""

    path: str
    settings: group_rewards.FilterSettings

    @classmethod
    def named(cls, path: str, settings: Mapping[str, Any] | None = None) -> GroupFilter:
        if path not in _RULES:
            raise GroupFilterError(
                f"rollout.dynamic_sampling_filter_path={path!r}: the local stage runs {', '.join(FILTER_PATHS)}"
            )
        try:
            return cls(path, group_rewards.FilterSettings(**dict(settings or {})))
        except (TypeError, ValueError) as exc:
            raise GroupFilterError(f"custom.aclarena_filters: {exc}") from exc

    def judge(self, group: list[Sample]) -> tuple[bool, str | None]:
        """Keep the group? (and why not). A filter may mask some samples' loss, as the no-tool rule does."""
        return _RULES[self.path](group, self.settings)


class PromptStream:
    """The stage's RL prompts, read in order from where the last round stopped; past the end it starts over."""

    def __init__(self, records: Sequence[dict[str, Any]]) -> None:
        if not records:
            raise GroupFilterError("no RL prompts to sample from")
        self.records, self.drawn = list(records), 0

    def take(self, n: int) -> list[tuple[int, dict[str, Any]]]:
        """The next ``n`` prompts, each with its position in the stream (its GRPO group's number)."""
        out = [(self.drawn + i, self.records[(self.drawn + i) % len(self.records)]) for i in range(n)]
        self.drawn += n
        return out


@dataclass
class SampledStep:
    """One step's rollouts: the groups kept for training and what it took to get them."""

    kept: list[list[Sample]]
    rolled_out: list[list[Sample]]
    rounds: int
    drops: dict[str, int]

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"groups_rolled_out": len(self.rolled_out), "groups_kept": len(self.kept),
                               "sampling_rounds": self.rounds}  # fmt: skip
        return {**out, "filter_drops": dict(sorted(self.drops.items()))} if self.drops else out


async def sample_groups(
    stream: PromptStream,
    roll: Callable[[list[tuple[int, dict[str, Any]]]], Awaitable[list[list[Sample]]]],
    batch: int,
    per_round: int,
    group_filter: GroupFilter | None,
    max_rounds: int,
) -> SampledStep:
    """Rounds of ``per_round`` prompts from ``stream`` (``roll`` rolls them out: one group per prompt, in order)
    until ``batch`` groups are kept or ``max_rounds`` rounds are spent (one round without a filter). The filter
    judges groups in prompt order; those past a full batch are not judged and not kept (slime aborts them).
    ``per_round`` is at least ``batch`` (the stage's builder checks it, as slime does)."""
    step = SampledStep(kept=[], rolled_out=[], rounds=0, drops={})
    while len(step.kept) < batch and step.rounds < (max_rounds if group_filter else 1):
        groups = await roll(stream.take(per_round))
        step.rounds += 1
        step.rolled_out += groups
        for group in groups:
            if len(step.kept) == batch:
                break
            keep, why = group_filter.judge(group) if group_filter else (True, None)
            if keep:
                step.kept.append(group)
            else:
                step.drops[why or "dropped"] = step.drops.get(why or "dropped", 0) + 1
    return step
