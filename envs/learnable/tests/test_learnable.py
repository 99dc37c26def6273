"""The learnable env: its reward, its turns, and the plugin contract."""

from __future__ import annotations

import pytest

from aclarena_envs.learnable.env import LearnableEnvironment
from aclarena_slime.plugin.conformance import check_environment, check_hostile_outputs
from aclarena_slime.plugin.contract import Done, Observation, Task


@pytest.mark.parametrize(
    ("answer", "reward"),
    [("123 ", 1.0), ("12ab", 0.5), ("abc\n", 0.0), ("", 0.0), ("   ", 0.0), ("0073", 1.0)],
)
async def test_reward_is_the_share_of_allowed_characters(answer, reward):
    env = LearnableEnvironment()
    episode = await env.start(Task(prompt="Write a number.", label="0123456789"))
    assert isinstance(await episode.step(answer), Done)
    assert (await episode.score()).reward == pytest.approx(reward)


async def test_several_turns_average_and_a_missing_answer_counts_zero():
    env = LearnableEnvironment({"turns": 3})
    episode = await env.start(Task(prompt="Write a number.", label="0123456789"))
    assert isinstance(await episode.step("12"), Observation)
    assert isinstance(await episode.step("ab"), Observation)
    assert (await episode.score()).reward == pytest.approx(1 / 3)  # the turn limit came first


async def test_conforms_to_the_env_contract():
    env = LearnableEnvironment({"turns": 2})
    records = env.demo_records(3, seed=1)
    assert all(r["metadata"]["env"] == "learnable" for r in records)
    assert records == env.demo_records(3, seed=1)
    await check_environment(env, [Task(r["prompt"], r["label"], r["metadata"]) for r in records], ["42 "])


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="turns"):
        LearnableEnvironment({"turns": 0})


async def test_survives_hostile_turns():
    env = LearnableEnvironment({})
    await check_hostile_outputs(env, [Task(r["prompt"], r["label"], r["metadata"]) for r in env.demo_records(1)])
