"""Group filters (slime's ``--dynamic-sampling-filter-path``): the authors' no-tool and task-variance rules,
through the edge's hooks (the plain rules live in ``aclarena_slime.group_rewards``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from aclarena_slime.group_rewards import FilterSettings, no_tool_mask
from aclarena_slime.slime_edge.custom import filters as filter_settings
from aclarena_slime.slime_edge.rollout import drop_no_tool, task_reward_nonzero_std
from aclarena_slime.testing.samples import FakeSample


def _keep(output) -> bool:
    return output if isinstance(output, bool) else output.keep


def _scored(breakdown: dict, reward: float = 0.0, removed: bool = False, length: int = 3) -> FakeSample:
    return FakeSample(
        reward=reward,
        remove_sample=removed,
        response_length=length,
        loss_mask=[1] * length,
        metadata={"env": "x", "aclarena": {"score": {"reward": reward, "breakdown": breakdown}}},
    )


@pytest.mark.parametrize(
    ("calls", "keep", "masked"),
    [
        ([1, 2, 0, 3], True, [False] * 4),  # 1/4 no-tool: at most 0.3, nothing masked
        ([1, 0, 0, 3], True, [False, True, True, False]),  # 2/4 > 0.3: the no-tool ones are masked
        ([0, 0, 0, 0], False, [True] * 4),  # nobody called: the group is dropped
        ([1, 0, None, 1], True, [False, True, False, False]),  # 1/3 of the counted > 0.3
        ([None, None], True, [False, False]),
    ],
)
def test_no_tool_mask(calls, keep, masked):
    assert no_tool_mask(calls, 0.3) == (keep, masked)


def test_drop_no_tool_masks_the_loss_but_keeps_the_rewards():
    samples = [_scored({"tool_calls": n}, reward=r) for n, r in ((1, 1.0), (0, 0.5), (0, -0.05), (2, 0.1))]
    assert _keep(drop_no_tool(SimpleNamespace(), samples))
    assert [s.loss_mask for s in samples] == [[1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1]]
    assert [s.reward for s in samples] == [1.0, 0.5, -0.05, 0.1], "they still count in the group baseline"
    lenient = [_scored({"tool_calls": n}) for n in (1, 0, 0, 2)]
    assert _keep(drop_no_tool(SimpleNamespace(aclarena_filters={"max_no_tool_fraction": 0.5}), lenient))
    assert all(s.loss_mask == [1, 1, 1] for s in lenient)
    nobody = [_scored({"tool_calls": 0}) for _ in range(3)]
    assert not _keep(drop_no_tool(SimpleNamespace(), nobody))


def test_drop_no_tool_refuses_an_env_that_reports_no_tool_calls():
    with pytest.raises(ValueError, match="'tool_calls'"):
        drop_no_tool(SimpleNamespace(), [_scored({"em": 1.0})])
    removed = _scored({}, removed=True)  # a removed sample has no score: it is skipped, not an error
    assert _keep(drop_no_tool(SimpleNamespace(), [removed, _scored({"tool_calls": 1})]))


def test_filter_settings_are_checked():
    assert filter_settings(SimpleNamespace()) == FilterSettings(0.3)
    with pytest.raises(ValueError, match="unknown aclarena_filters keys"):
        filter_settings(SimpleNamespace(aclarena_filters={"max_no_tool": 0.3}))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        FilterSettings(1.5)


def test_task_reward_nonzero_std_reads_the_task_outcome_before_shaping():
    # every sample failed the task; shaping penalties made the rewards differ: still no signal
    failed = [_scored({"task_reward": 0.0}, reward=r) for r in (0.0, -0.2, -0.3, 0.0)]
    assert not _keep(task_reward_nonzero_std(SimpleNamespace(), failed))
    mixed = [_scored({"task_reward": t}, reward=r) for t, r in ((1.0, 0.9), (0.0, -0.2))]
    assert _keep(task_reward_nonzero_std(SimpleNamespace(), mixed))
    # without a task_reward the reward itself is used, as slime's check_reward_nonzero_std does
    plain = [_scored({}, reward=r) for r in (1.0, 1.0)]
    assert not _keep(task_reward_nonzero_std(SimpleNamespace(), plain))
    # a removed sample's placeholder reward is no variance
    with_removed = [_scored({}, reward=1.0), _scored({}, reward=1.0), _scored({}, reward=0.0, removed=True)]
    assert not _keep(task_reward_nonzero_std(SimpleNamespace(), with_removed))


@pytest.mark.slime
def test_slime_loads_the_filters_and_reads_their_output():
    from slime.rollout.filter_hub.base_types import DynamicFilterOutput, call_dynamic_filter
    from slime.utils.misc import load_function

    from aclarena_slime.slime_edge import path
    from aclarena_slime.slime_edge import rollout as edge

    for name in ("drop_no_tool", "reward_nonzero_std", "task_reward_nonzero_std"):
        assert load_function(path(name)) is getattr(edge, name)
    nobody = [_scored({"tool_calls": 0}) for _ in range(2)]
    output = call_dynamic_filter(edge.drop_no_tool, SimpleNamespace(), nobody)
    assert output == DynamicFilterOutput(keep=False, reason="all_no_tool")
