"""Discovery by entry point, loud failures, and the conformance kit on our own envs."""

from __future__ import annotations

import pickle
from importlib.metadata import EntryPoint

import pytest

from aclarena_slime import registry
from aclarena_slime.conformance import ConformanceError, check_environment
from aclarena_slime.contract import Conversation, Done, Environment, Episode, Observation, Score, Task


def test_in_repo_plugins_are_discovered_through_entry_points():
    assert {"math", "mock", "search", "retail", "ifeval"} <= set(registry.available_tags())
    assert type(registry.get_environment("math")).__name__ == "MathEnvironment"
    assert registry.get_environment("math") is not registry.get_environment("math")  # the caller owns each one


def test_unknown_tag_names_the_known_ones():
    with pytest.raises(registry.UnknownEnvironment, match="known tags: .*math.*mock"):
        registry.get_environment("no-such-env")


def test_a_broken_plugin_fails_loudly_with_its_name(monkeypatch):
    broken = EntryPoint(name="broken", value="aclarena_envs.does_not_exist.env:Nope", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_entry_points", lambda: {"broken": broken})
    with pytest.raises(registry.PluginLoadError, match="'broken'.*does_not_exist"):
        registry.get_environment("broken")


def test_a_factory_that_builds_no_environment_is_refused():
    registry.register("not-an-env", lambda config: object())
    with pytest.raises(TypeError, match="not an aclarena_slime.contract.Environment"):
        registry.get_environment("not-an-env")


def test_task_round_trips_through_pickle_and_decodes_json_labels():
    task = Task(prompt=[{"role": "user", "content": "q"}], label='{"target": ["Paris"]}', metadata={"env": "x"})
    assert pickle.loads(pickle.dumps(task)) == task
    assert task.label_value == {"target": ["Paris"]}
    assert Task(prompt="p", label="not json").label_value == "not json"


async def test_our_envs_conform():
    await check_environment(registry.get_environment("math"), [Task("What is 1+1?", "2", {"env": "math"})])
    await check_environment(registry.get_environment("mock"), [Task("", "pear", {"env": "mock"})])


async def test_the_kit_catches_a_crashing_step_and_a_bad_reward():
    class Bad(Episode):
        conversation = Conversation([{"role": "assistant", "content": "I speak first"}])

        async def step(self, text):
            if not text:
                raise ValueError("empty turn")
            return Observation([{"role": "assistant", "content": "wrong role"}])

        async def score(self):
            return Score(7.0, {"not json": object()})

    class BadEnv(Environment):
        tag = "bad"

        async def start(self, task):
            return Bad()

    with pytest.raises(ConformanceError) as info:
        await check_environment(BadEnv(), [Task("p")])
    message = str(info.value)
    for expected in (
        "end with a user or tool message",
        "step() raised ValueError",
        "observation roles",
        "outside reward_range",
        "not JSON-serialisable",
    ):
        assert expected in message


async def test_the_kit_accepts_a_minimal_correct_env():
    class Echo(Episode):
        def __init__(self, task):
            self.task, self.said = task, ""
            self.conversation = Conversation([{"role": "user", "content": f"Say {task.label}."}])

        async def step(self, text):
            self.said = text
            return Done("answered")

        async def score(self):
            return Score(float(str(self.task.label) in self.said), {})

    class EchoEnv(Environment):
        tag = "echo"

        async def start(self, task):
            return Echo(task)

    await check_environment(EchoEnv(), [Task("p", "hello")], turns=["hello"])


async def test_the_kit_reports_a_crashing_start_bad_tools_and_non_dict_messages():
    class Odd(Episode):
        def __init__(self):
            self.conversation = Conversation(["not a dict message"], tools=[{"fn": object()}])

        async def step(self, text):
            return Observation(["also not a dict"])

        async def score(self):
            return Score(0.0)

    class OddEnv(Environment):
        tag = "odd"

        async def start(self, task):
            if task.label == "crash":
                raise RuntimeError("cannot start")
            return Odd()

    with pytest.raises(ConformanceError) as info:
        await check_environment(OddEnv(), [Task("p", "crash"), Task("p", "ok")])
    message = str(info.value)
    for expected in (
        "task 0: start() raised RuntimeError: cannot start",
        "task 1 conversation: each message needs a 'role'",
        "task 1: the conversation must end with a user or tool message",
        "task 1: tools are not JSON-serialisable",
        "observation: each message needs a 'role'",
        "observation roles must be user/tool, got ['None']",
    ):
        assert expected in message
