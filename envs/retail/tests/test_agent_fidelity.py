"""The authors' retail agent beside ours, on the real τ³ data: one tool call per turn, and a failing
simulated customer scored -0.3 instead of dropping the sample. Both verdicts each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aclarena_envs.retail.data import RetailData
from aclarena_envs.retail.env import RetailEnvironment
from aclarena_envs.retail.gold import tool_call_text
from aclarena_envs.retail.user_sim import ScriptedUser, UserSession, UserSimulator
from aclarena_slime.plugin.contract import Done, EpisodeAborted, Observation, Task
from aclarena_slime.recipes.compose import load_recipe

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def call(name: str, **arguments) -> str:
    return tool_call_text({"name": name, "arguments": arguments})


def first_user(data_dir: Path) -> tuple[str, str]:
    users = json.loads((data_dir / "db.json").read_text())["users"]
    user = next(iter(users.values()))
    return user["email"], user["orders"][0]


def task(task_id: str = "0") -> Task:
    return Task(prompt=f"tau3-retail task {task_id}", label=task_id, metadata={"env": "retail", "task_id": task_id})


async def test_only_the_first_call_of_a_turn_runs_for_the_authors(real_data):
    email, order = first_user(real_data)
    two_calls = call("find_user_id_by_email", email=email) + "\n" + call("get_order_details", order_id=order)
    data = RetailData.load(real_data)
    verdicts = {}
    for first_only in (False, True):
        env = RetailEnvironment({"first_call_only": first_only}, user_simulator=ScriptedUser(["Hi."]), data=data)
        episode = await env.start(task())
        observation = await episode.step(two_calls)
        assert isinstance(observation, Observation)
        verdicts[first_only] = [m.get("name") for m in observation.messages]
    assert verdicts[False] == ["find_user_id_by_email", "get_order_details"]  # ours: both run
    assert verdicts[True] == ["find_user_id_by_email"]  # theirs: the second is dropped unanswered


class FailsOnSecondReply(UserSimulator):
    """A simulated customer whose service fails after greeting the agent."""

    def session(self, scenario: str) -> UserSession:
        return _Failing()


class _Failing(UserSession):
    def __init__(self) -> None:
        self.replies = 0

    async def reply(self, agent_text: str) -> str:
        self.replies += 1
        if self.replies > 1:
            raise EpisodeAborted("user simulator failed after 9 attempts")
        return "I want to cancel an order."


async def test_a_failing_customer_is_scored_by_the_authors_and_dropped_by_us(real_data):
    data = RetailData.load(real_data)
    ours = RetailEnvironment({"shaping": {}}, user_simulator=FailsOnSecondReply(), data=data)
    episode = await ours.start(task())
    with pytest.raises(EpisodeAborted):
        await episode.step("Could you give me your email?")

    theirs = RetailEnvironment({"shaping": {"user_failure": -0.3}}, user_simulator=FailsOnSecondReply(), data=data)
    episode = await theirs.start(task())
    assert await episode.step("Could you give me your email?") == Done("user_failure")
    score = await episode.score()
    assert score.reward == -0.3 and score.breakdown["end"] == "user_failure"
    assert theirs.reward_range == (-0.3, 1.0)


async def test_a_customer_failing_at_the_greeting_is_removed_as_the_authors_no_op(real_data):
    """The authors emit a zero-gradient no-op with reward 0.0 (generate_with_tau.py:114-174): nothing of the
    agent exists yet to train on, so the start aborts (a removed sample) whatever user_failure says."""

    class FailsAtOnce(UserSimulator):
        def session(self, scenario: str) -> UserSession:
            failing = _Failing()
            failing.replies = 1
            return failing

    data = RetailData.load(real_data)
    with pytest.raises(EpisodeAborted):
        await RetailEnvironment({"shaping": {}}, user_simulator=FailsAtOnce(), data=data).start(task())
    env = RetailEnvironment({"shaping": {"user_failure": -0.3}}, user_simulator=FailsAtOnce(), data=data)
    with pytest.raises(EpisodeAborted):
        await env.start(task())


@pytest.mark.parametrize("name", ["stage3_retail.yaml", "oracle_retail.yaml", "mle_retail.yaml"])
def test_the_paper_recipes_use_the_authors_agent_rules(name, tmp_path):
    recipe = load_recipe(RECIPES / name, [f"paths.root={tmp_path}"])
    retail = recipe.env_config["retail"]
    assert retail["first_call_only"] is True and retail["shaping"]["user_failure"] == -0.3
    assert retail["turn_parsing"] == "authors"


def test_bad_settings_are_refused(tiny_data):
    with pytest.raises(ValueError, match="first_call_only must be true or false"):
        RetailEnvironment(
            {"data_dir": str(tiny_data), "first_call_only": "yes", "user": {"kind": "scripted", "replies": []}}
        )
