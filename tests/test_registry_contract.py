"""Discovery by entry point, loud failures, and the conformance kit on our own envs."""

from __future__ import annotations

import pickle
from importlib.metadata import EntryPoint

import pytest

from aclarena_slime.plugin import registry
from aclarena_slime.plugin.conformance import ConformanceError, check_environment
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Observation, Score, Task


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
    with pytest.raises(TypeError, match="not an aclarena_slime.plugin.contract.Environment"):
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
        await check_environment(BadEnv(), [Task("p")], entry_point=False)
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

    await check_environment(EchoEnv(), [Task("p", "hello")], turns=["hello"], entry_point=False)


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
        await check_environment(OddEnv(), [Task("p", "crash"), Task("p", "ok")], entry_point=False)
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


class _Unregistered(Environment):
    """A plugin class whose author added the pyproject line but did not reinstall."""

    tag = "unregistered-echo"

    async def start(self, task):
        return _SayEpisode()


class _SayEpisode(Episode):
    conversation = Conversation([{"role": "user", "content": "Say something."}])

    async def step(self, text):
        return Done()

    async def score(self):
        return Score(0.0)


async def test_the_kit_says_to_reinstall_when_the_tag_has_no_installed_entry_point():
    with pytest.raises(ConformanceError) as info:
        await check_environment(_Unregistered(), [Task("p")])
    message = str(info.value)
    assert "tag 'unregistered-echo' is not registered in the entry-point group 'aclarena_slime.envs'" in message
    assert f'unregistered-echo = "{__name__}:_Unregistered"' in message
    assert "reinstall your package (pip install -e .)" in message
    await check_environment(_Unregistered(), [Task("p")], entry_point=False)  # the rest of it conforms


async def test_the_kit_refuses_a_tag_whose_entry_point_names_another_class(monkeypatch):
    stale = EntryPoint(name="unregistered-echo", value="aclarena_envs.mock.env:MockEnvironment", group="g")
    monkeypatch.setattr(registry, "_entry_points", lambda: {"unregistered-echo": stale})
    with pytest.raises(ConformanceError, match="resolves through its installed entry point to 'aclarena_envs.mock.env:"
                       "MockEnvironment', not '.*_Unregistered'.*reinstall"):
        await check_environment(_Unregistered(), [Task("p")])
    broken = EntryPoint(name="unregistered-echo", value="aclarena_envs.gone.env:Gone", group="g")
    monkeypatch.setattr(registry, "_entry_points", lambda: {"unregistered-echo": broken})
    with pytest.raises(ConformanceError, match="entry point 'aclarena_envs.gone.env:Gone' fails to load"):
        await check_environment(_Unregistered(), [Task("p")])


async def test_the_kit_names_a_stale_egg_info_that_hides_the_reinstalled_entry_points(tmp_path, monkeypatch):
    """Python reads the first copy of a distribution's metadata on sys.path: an old in-tree .egg-info wins."""
    stale = tmp_path / "aclarena_slime.egg-info"
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: aclarena-slime\nVersion: 0.0.1\n")
    (stale / "top_level.txt").write_text("aclarena_slime\naclarena_envs\n")
    (stale / "entry_points.txt").write_text("[aclarena_slime.envs]\nmath = aclarena_envs.math.env:MathEnvironment\n")
    assert "template" in registry.available_tags()
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "template" not in registry.available_tags(), "the stale copy hides the installed entry points"
    from aclarena_envs.template.env import TemplateEnvironment

    with pytest.raises(ConformanceError, match=rf"several copies of aclarena-slime's metadata.*{stale}.*delete the stale"):
        await check_environment(TemplateEnvironment(), [Task("Say red.", "red")])


def test_a_tag_claimed_by_two_installed_packages_is_an_error(tmp_path, monkeypatch):
    """Before, whichever entry point came last won, silently."""
    other = tmp_path / "other_env-0.1.dist-info"
    other.mkdir()
    (other / "METADATA").write_text("Metadata-Version: 2.1\nName: other-env\nVersion: 0.1\n")
    (other / "entry_points.txt").write_text("[aclarena_slime.envs]\nmock = other_env.env:OtherMock\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.PluginLoadError, match=r"'mock' is registered by several installed packages: "
                       r"aclarena_envs.mock.env:MockEnvironment \(package aclarena-slime\), other_env.env:OtherMock \(package other-env\)"):
        registry.load_factory("mock")


async def test_the_kit_reports_a_check_label_that_refuses_the_envs_own_label():
    """The data readers call check_label on every record: one refusing a good label would fail a whole dataset."""

    class Fine(Episode):
        conversation = Conversation([{"role": "user", "content": "say hi"}])

        async def step(self, text):
            return Done("answered")

        async def score(self):
            return Score(1.0)

    class Strict(Environment):
        tag = "strict"

        async def start(self, task):
            return Fine()

        def check_label(self, label):
            raise ValueError(f"no label is ever good, not even {label!r}")

    with pytest.raises(ConformanceError, match=r"task 0: check_label refused its label 'hi' \(ValueError: no label"):
        await check_environment(Strict(), [Task("p", "hi")], entry_point=False)


def test_a_variant_tag_names_its_plugin_under_a_tag_of_its_own():
    env = registry.get_environment("mock-fruit")
    assert type(env).__name__ == "MockEnvironment" and type(env).tag == "mock"
    assert env.tag == "mock-fruit"  # the built env reports the variant: its records carry it
    assert {r["metadata"]["env"] for r in env.demo_records(3)} == {"mock-fruit"}
    assert registry.get_environment("mock").tag == "mock"
    assert registry.plugin_tag("mock-fruit") == "mock" and registry.is_variant("mock-fruit")
    assert not registry.is_variant("mock")
    assert registry.environment_class("mock-fruit") is type(env)
    assert registry.entry_point("mock-fruit") == registry.entry_point("mock")


def test_an_exact_registration_wins_over_the_variant_reading(monkeypatch):
    class Special(Environment):
        tag = "mock-special"

        async def start(self, task):
            raise NotImplementedError

    monkeypatch.setitem(registry._registered, "mock-special", Special)
    assert type(registry.get_environment("mock-special")) is Special
    assert registry.plugin_tag("mock-special") == "mock-special"
    assert type(registry.get_environment("mock-other")).__name__ == "MockEnvironment"


def test_a_variant_of_an_unknown_plugin_is_the_same_clear_error():
    with pytest.raises(registry.UnknownEnvironment, match="'nosuch-fruit' .*variant.*known tags: .*math.*mock"):
        registry.get_environment("nosuch-fruit")
    with pytest.raises(registry.UnknownEnvironment, match="known tags"):
        registry.load_factory("mock-")  # no variant part: not a variant of mock
    assert registry.entry_point("nosuch-fruit") is None


def test_data_prepare_refuses_a_variant_whose_preparation_takes_no_tag(capsys):
    from aclarena_slime.cli import main

    assert main(["data", "prepare", "math-easy", "--help"]) == 2  # math's main(argv) would write records tagged math
    assert "'math-easy' is a variant tag" in capsys.readouterr().err


@pytest.mark.parametrize("plugin", ["math", "mock", "ifeval", "search", "template", "learnable"])
def test_each_plugins_demo_records_carry_the_variant_tag(plugin):
    env = registry.get_environment(f"{plugin}-variant")
    assert {r["metadata"]["env"] for r in env.demo_records(2, seed=0)} == {f"{plugin}-variant"}
