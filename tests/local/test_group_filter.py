"""Dynamic sampling on the local backend: slime's group filter and over-sampling, in reproducible rounds."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from aclarena_slime import group_rewards
from aclarena_slime.local.group_filter import FILTER_PATHS, GroupFilter, GroupFilterError, PromptStream, sample_groups
from aclarena_slime.local.stage import run_stage
from aclarena_slime.plugin import registry
from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.sample import Sample
from aclarena_slime.testing.local import LEARNABLE, local_session

NONZERO_STD = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"


def group(*rewards: float, index: int = 0) -> list[Sample]:
    return [Sample(group_index=index, reward=r, loss_mask=[1], response_length=1) for r in rewards]


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch on one reward: "degrees of freedom is <= 0"
@pytest.mark.parametrize(
    "rewards", [(0.0, 0.0, 0.0, 0.0), (1.0, 1.0), (0.0, 1.0), (0.5, 0.5, 0.5, 0.5 + 1e-9), (0.2, 0.3, 0.2, 0.2), (1.0,)]
)
def test_the_reward_rule_is_slimes_check_reward_nonzero_std(rewards):
    """slime's rule (``dynamic_sampling_filters.py``): the torch float64 std of the rewards above 1e-6."""
    slime_keeps = bool(torch.tensor(rewards, dtype=torch.float64).std() > 1e-6)
    keep, why = group_rewards.reward_nonzero_std(group(*rewards))
    assert keep == slime_keeps
    assert (why is None) == keep


def roller(reward_of):
    """A stand-in for the engine: each prompt's group gets the rewards ``reward_of(prompt number)``."""
    calls = []

    async def roll(numbered):
        calls.append([n for n, _ in numbered])
        return [group(*reward_of(n), index=n) for n, _ in numbered]

    return roll, calls


def test_rounds_fill_the_batch_with_kept_groups_in_prompt_order():
    # Every third prompt's group has a spread: 4 kept groups take 12 prompts, three rounds of 4.
    roll, calls = roller(lambda n: (0.0, 1.0) if n % 3 == 0 else (1.0, 1.0))
    stream = PromptStream([{"prompt": f"p{i}"} for i in range(100)])
    step = asyncio.run(sample_groups(stream, roll, 4, 4, GroupFilter.named(NONZERO_STD), max_rounds=8))
    assert calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [g[0].group_index for g in step.kept] == [0, 3, 6, 9]
    assert step.figures() == {"groups_rolled_out": 12, "groups_kept": 4, "sampling_rounds": 3,
                              "filter_drops": {"zero_std_1.0": 6}}  # fmt: skip
    # The next step starts where this one stopped.
    step = asyncio.run(sample_groups(stream, roll, 2, 8, GroupFilter.named(NONZERO_STD), max_rounds=8))
    assert calls[-1] == list(range(12, 20)) and [g[0].group_index for g in step.kept] == [12, 15]
    assert step.drops == {"zero_std_1.0": 2}  # groups past a full batch are not judged (slime aborts them)


def test_a_step_stops_after_its_rounds_and_trains_on_what_it_kept():
    roll, calls = roller(lambda n: (0.0, 0.0))  # nothing to learn from anywhere
    step = asyncio.run(sample_groups(PromptStream([{}] * 10), roll, 4, 4, GroupFilter.named(NONZERO_STD), 3))
    assert len(calls) == 3 and step.kept == [] and step.drops == {"zero_std_0.0": 12}
    # Past the end of its records the stream starts over (the group numbers keep counting).
    assert calls[-1] == [8, 9, 10, 11]


def test_without_a_filter_a_step_is_its_first_batch_of_the_round():
    roll, calls = roller(lambda n: (0.0, 0.0))
    step = asyncio.run(sample_groups(PromptStream([{}] * 10), roll, 2, 3, None, max_rounds=4))
    assert calls == [[0, 1, 2]] and [g[0].group_index for g in step.kept] == [0, 1] and step.drops == {}


def test_settings_the_local_stage_cannot_run_are_clear_errors(tmp_path):
    with pytest.raises(GroupFilterError, match="the local stage runs"):
        GroupFilter.named("slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback")
    with pytest.raises(GroupFilterError, match="max_no_tool_fraction"):
        GroupFilter.named(FILTER_PATHS[2], {"max_no_tool_fraction": 2})
    base = (*LEARNABLE, "rollout.rollout_batch_size=4")
    with pytest.raises(RecipeError, match="over_sampling_prompts=2 is below prompts_per_step=4"):
        local_session(tmp_path, *base, "rollout.over_sampling_batch_size=2")
    with pytest.raises(RecipeError, match="dynamic_sampling_filter_path"):
        local_session(tmp_path, *base, "rollout.dynamic_sampling_filter_path=my.filter")
    with pytest.raises(ValueError, match="max_sampling_rounds"):
        local_session(tmp_path, *base, f"rollout.dynamic_sampling_filter_path={NONZERO_STD}",
                      "++cluster.local.max_sampling_rounds=0")  # fmt: skip


def test_the_no_tool_rule_masks_and_drops_as_on_slime():
    def sample(calls: int) -> Sample:
        s = Sample(reward=0.0, loss_mask=[1, 1], response_length=2)
        s.metadata = {"aclarena": {"score": {"breakdown": {"tool_calls": calls}}}}
        return s

    rule = GroupFilter.named("aclarena_slime.slime_edge.rollout.drop_no_tool", {"max_no_tool_fraction": 0.25})
    assert rule.judge([sample(0), sample(0)]) == (False, "all_no_tool")
    mixed = [sample(1), sample(0), sample(0), sample(2)]
    assert rule.judge(mixed) == (True, None) and [s.loss_mask for s in mixed] == [[1, 1], [0, 0], [0, 0], [1, 1]]


def test_a_grpo_stage_with_dynamic_sampling_trains_on_kept_groups_only(tmp_path):
    from aclarena_envs.learnable.env import LearnableEnvironment

    registry.register("learnable", LearnableEnvironment)
    session = local_session(
        tmp_path, *LEARNABLE, "rollout.num_rollout=2", "rollout.rollout_batch_size=2", "rollout.n_samples_per_prompt=4",
        "rollout.rollout_max_response_len=8", "++cluster.local.eval_size=2", "++cluster.local.torch_threads=1",
        "++cluster.local.progress=false", "algorithm.lr=5e-2", "++cluster.local.seed=1",
        f"rollout.dynamic_sampling_filter_path={NONZERO_STD}", "rollout.over_sampling_batch_size=4",
        "++cluster.local.max_sampling_rounds=3",
    )  # fmt: skip
    metrics = run_stage(session)
    for step in metrics["steps"]:
        assert step["groups_rolled_out"] == 4 * step["sampling_rounds"] and step["sampling_rounds"] <= 3
        assert step["groups_kept"] + sum(step.get("filter_drops", {}).values()) <= step["groups_rolled_out"]
        # Every kept group has a reward spread: every trained sample has an advantage (unless none was kept).
        assert step["samples"] == 4 * step["groups_kept"]
        if step["groups_kept"]:
            assert step["nonzero_adv_frac"] == 1.0
    rollout = json.loads(session.paths.metrics_path.read_text())["config"]["rollout"]
    assert rollout["dynamic_sampling_filter_path"] == NONZERO_STD and rollout["over_sampling_batch_size"] == 4


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_math_and_if_recipes_bounded_filter_runs_locally_with_slimes_rule():
    """The recipes' filter (slime's rule behind our refill bound) is slime's rule to the local stage: it was
    refused as unknown."""
    ours = GroupFilter.named("aclarena_slime.slime_edge.rollout.reward_nonzero_std")
    slimes = GroupFilter.named(NONZERO_STD)
    for rewards in [(0.0, 0.0), (0.0, 1.0), (1.0, 1.0, 1.0), (0.2, 0.3)]:
        assert ours.judge(group(*rewards)) == slimes.judge(group(*rewards))
