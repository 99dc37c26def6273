"""Run-time guards over what the rollouts produce (issue 44): a run whose env service died stops instead of
training on nothing, and a filter that drops every group stops slime's refill loop instead of spinning."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from aclarena_slime.group_rewards import GuardSettings
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.rollout_guard import RefillExhausted, RolloutsLost
from aclarena_slime.slime_edge import rollout as edge
from aclarena_slime.testing.samples import FakeSample

REPO = Path(__file__).resolve().parents[1]
RETRIEVER_DOWN = "search retriever failed: retriever http://127.0.0.1:8000/retrieve failed: ClientConnectorError"


def _aborted(group: int, error: str = RETRIEVER_DOWN) -> FakeSample:
    """A sample as ``fill_sample`` leaves it when the env's service failed: aborted, removed, floor reward."""
    return FakeSample(
        group_index=group, reward=0.0, remove_sample=True, status=FakeSample.Status.ABORTED, response_length=2,
        loss_mask=[1, 1], metadata={"env": "search", "aclarena": {"end": "env_aborted", "error": error}},
    )  # fmt: skip


def _scored(group: int, reward: float, tool_calls: int = 1) -> FakeSample:
    return FakeSample(
        group_index=group, reward=reward, status=FakeSample.Status.COMPLETED, response_length=2, loss_mask=[1, 1],
        metadata={"env": "search", "aclarena": {"end": "answer", "score": {
            "reward": reward, "breakdown": {"tool_calls": tool_calls, "task_reward": reward}}}},
    )  # fmt: skip


def _args(**settings) -> SimpleNamespace:
    base = {"advantage_estimator": "grpo", "n_samples_per_prompt": 4, "rollout_batch_size": 4,
            "over_sampling_batch_size": None}  # fmt: skip
    return SimpleNamespace(**{**base, **settings})


def test_a_rollout_that_lost_every_sample_is_logged_with_counts_and_reasons(caplog):
    """Today: 16 of 16 aborted and removed, rewards 0.0, not one line at WARNING."""
    args = _args()
    batch = [_aborted(g) for g in range(4) for _ in range(4)]
    with caplog.at_level(logging.WARNING):
        raw, rewards = edge.reward_post_process(args, batch)
    assert rewards == [0.0] * 16
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    text = record.getMessage()
    assert "rollout 1: 16 of 16 samples removed or aborted (env_aborted 16)" in text
    assert RETRIEVER_DOWN in text


def test_three_lost_rollouts_in_a_row_stop_the_job_and_a_healthy_one_resets_the_count(caplog):
    args = _args()
    lost = [_aborted(g) for g in range(4) for _ in range(4)]
    healthy = [_scored(g, r) for g in range(4) for r in (0.0, 1.0, 0.0, 1.0)]
    edge.reward_post_process(args, lost)
    edge.reward_post_process(args, lost)
    edge.reward_post_process(args, healthy)  # the count starts again
    edge.reward_post_process(args, lost)
    edge.reward_post_process(args, lost)
    with pytest.raises(RolloutsLost, match=r"rollout 6: 16 of 16 .*3 rollouts in a row lost most of their samples"):
        edge.reward_post_process(args, lost)


def test_a_minority_of_lost_samples_is_no_alarm(caplog):
    args = _args()
    batch = [_scored(g, float(i % 2)) for g in range(4) for i in range(4)]
    batch[:8] = [_aborted(0) for _ in range(8)]  # exactly half: not more than max_lost_fraction
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            edge.reward_post_process(args, batch)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_retriever_outage_path_end_to_end_stops_the_run():
    """drop_no_tool keeps an all-removed group (nothing to judge), so a dead retriever reaches training: the
    batch guard is what stops it."""
    args = _args(aclarena_guards={"max_bad_rollouts": 2})
    groups = [[_aborted(g) for _ in range(4)] for g in range(4)]
    assert all(edge.filter_output(True, None) == edge.drop_no_tool(args, group) for group in groups)
    edge.reward_post_process(args, [s for group in groups for s in group])
    with pytest.raises(RolloutsLost):
        edge.reward_post_process(args, [s for group in groups for s in group])


def test_a_dead_user_simulator_stops_the_refill_loop_instead_of_spinning():
    """Every retail sample aborted: each group has < 2 scorable samples and is dropped; slime's loop refills for
    ever. Now the filter raises once max_refill_rounds rounds (of rollout_batch_size groups) dropped in a row."""
    args = _args()  # 4 groups a round, 10 rounds
    judged = 0
    with pytest.raises(RefillExhausted, match=r"dropped 40 groups in a row \(too_few_kept 40\), 10 rounds of 4"):
        while judged < 1000:  # slime's loop: no bound of its own
            judged += 1
            edge.task_reward_nonzero_std(args, [_aborted(judged, "user simulator at X failed") for _ in range(4)])
    assert judged == 40


def test_a_kept_group_resets_the_refill_count():
    args = _args(over_sampling_batch_size=2, aclarena_guards={"max_refill_rounds": 3})  # 6 drops in a row
    same = [_scored(0, 0.0, tool_calls=0) for _ in range(4)]  # nobody searched: dropped
    varied = [_scored(0, r) for r in (0.0, 1.0, 1.0, 0.0)]
    for _ in range(5):
        edge.drop_no_tool(args, [_scored(0, 0.0, tool_calls=0) for _ in range(4)])
    edge.drop_no_tool(args, varied)
    for _ in range(5):
        edge.drop_no_tool(args, [_scored(0, 0.0, tool_calls=0) for _ in range(4)])
    with pytest.raises(RefillExhausted, match="all_no_tool 6"):
        edge.drop_no_tool(args, same)


def test_guard_settings_are_checked_and_reach_slime(tmp_path: Path):
    with pytest.raises(ValueError, match="max_lost_fraction"):
        GuardSettings(max_lost_fraction=1.5)
    with pytest.raises(ValueError, match="max_bad_rollouts"):
        GuardSettings(max_bad_rollouts=-1)
    recipe = load_recipe(REPO / "recipes/stage2_search.yaml",
                         [f"paths.root={tmp_path}", "+custom.aclarena_guards.max_bad_rollouts=5"])  # fmt: skip
    assert compile_recipe(recipe).custom_config["aclarena_guards"]["max_bad_rollouts"] == 5
    with pytest.raises(RecipeError, match="max_refil"):
        load_recipe(REPO / "recipes/stage2_search.yaml", [f"paths.root={tmp_path}", "+custom.aclarena_guards.max_refil=5"])


def test_mopd_batches_are_guarded_too():
    from aclarena_slime.slime_edge.mopd import mopd_post_process

    args = _args(aclarena_guards={"max_bad_rollouts": 1})
    with pytest.raises(RolloutsLost, match="teacher"):
        mopd_post_process(args, [_aborted(g, "teacher http://t:1 failed") for g in range(4) for _ in range(4)])


def test_slimes_reward_rule_for_math_and_if_is_bounded_too():
    """slime's check_reward_nonzero_std (the math and IF recipes' filter) has no refill bound: a model whose groups
    all score alike spins its loop for ever. Ours is the same rule (the std of the group's rewards above 1e-6,
    slime/rollout/filter_hub/dynamic_sampling_filters.py) behind the same bound."""
    args = _args(over_sampling_batch_size=8, aclarena_guards={"max_refill_rounds": 2})  # 16 drops in a row
    assert edge.reward_nonzero_std(args, [_scored(0, r) for r in (0.0, 1.0, 0.0, 0.0)]) is True
    judged = 0
    with pytest.raises(RefillExhausted, match=r"dropped 16 groups in a row \(zero_std_0.0 16\), 2 rounds of 8"):
        while judged < 1000:
            judged += 1
            edge.reward_nonzero_std(args, [_scored(judged, 0.0) for _ in range(4)])
    assert judged == 16


def test_the_math_and_if_recipes_run_the_bounded_filter(tmp_path: Path):
    """Every recipe that ran slime's unbounded filter (the math and IF stages and their mle_/oracle_ variants)
    compiles to ours, with the bound its FIDELITY row reads."""
    from aclarena_slime.dotted import load_dotted

    for name in ("stage1_math", "stage4_if", "mle_math", "mle_if", "oracle_math", "oracle_if"):
        command = compile_recipe(load_recipe(REPO / f"recipes/{name}.yaml", [f"paths.root={tmp_path}"]))
        argv = command.train_args
        path = argv[argv.index("--dynamic-sampling-filter-path") + 1]
        assert load_dotted(path) is edge.reward_nonzero_std, name
        assert command.custom_config["aclarena_guards"]["max_refill_rounds"] == GuardSettings().max_refill_rounds


def test_rollout_only_batches_are_guarded_through_slimes_rollout_log_hook(caplog):
    """A teacher or oracle rollout-only run (--debug-rollout-only) returns before the reward post-process, so its
    lost batches went unseen: a dead retriever dumped an all-aborted batch every rollout to a "successful" end.
    slime's RolloutManager.generate calls the rollout-log hook with each batch whole (slime/ray/rollout.py
    generate -> log_rollout_data): the guard runs there, and slime's own logging goes on (it returns False)."""
    args = _args(aclarena_guards={"max_bad_rollouts": 2})
    healthy = [_scored(g, 1.0) for g in range(4) for _ in range(4)]
    assert edge.rollout_log(0, args, healthy, None, 1.0) is False
    lost = [_aborted(g) for g in range(4) for _ in range(4)]
    with caplog.at_level(logging.WARNING):
        assert edge.rollout_log(1, args, lost, None, 1.0) is False
    assert "16 of 16 samples removed or aborted" in caplog.text
    with pytest.raises(RolloutsLost, match="2 rollouts in a row"):
        edge.rollout_log(2, args, lost, {"rollout/x": 1}, 1.0)
