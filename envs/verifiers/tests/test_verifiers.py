"""The verifiers bridge with the real library: a SingleTurnEnv and a ToolEnv / MultiTurnEnv defined here, loaded by
module name, run as aclarena envs; the model's turns come from our loop (a ToolEnv sample carries exactly the ids the
engine produced, tool results masked), the rubric is the reward, and the env's failures abort the sample with the
reason instead of crashing the rollout or training on a 0."""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers")

from datasets import Dataset  # noqa: E402

from aclarena_envs.verifiers import data  # noqa: E402
from aclarena_envs.verifiers.env import VerifiersEnvironment  # noqa: E402
from aclarena_slime.agent_loop import ABORTED, COMPLETED, TRUNCATED, LoopSettings, run_episode  # noqa: E402
from aclarena_slime.chat_tokens import ChatTokens  # noqa: E402
from aclarena_slime.local.demos import ScriptedClient  # noqa: E402
from aclarena_slime.plugin.conformance import check_environment, check_hostile_outputs  # noqa: E402
from aclarena_slime.plugin.contract import Done, EpisodeAborted, Observation, Task  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
MODULE = "aclarena_vf_test_envs"
SUMS = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(2, 3), (4, 4), (1, 6), (5, 2)]]


def exact(completion, answer, **_) -> float:
    return float(str(completion[-1].content or "").strip() == answer)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


async def slow(seconds: float) -> str:
    """Wait for a remote service, then answer.

    Args:
        seconds: How long the service takes.
    """
    await asyncio.sleep(seconds)
    return "done"


class Countdown(vf.MultiTurnEnv):
    """The user asks for the answer again until it is right (a MultiTurnEnv with its own env_response)."""

    async def get_prompt_messages(self, state):
        if state.get("forget") and state["trajectory"]:  # an env that rewrites the history: only the question again
            return list(state["prompt"])
        return await super().get_prompt_messages(state)

    async def env_response(self, messages, state, **kwargs):
        if state.get("crash"):
            raise RuntimeError("env_response crashed")
        return [vf.UserMessage(content="Not yet. Try again.")]

    @vf.stop
    async def answered(self, state) -> bool:
        trajectory = state["trajectory"]
        return bool(trajectory) and str(trajectory[-1]["completion"][-1].content or "").strip() == state["answer"]


def load_environment(kind: str = "single", broken_rubric: bool = False, crash: bool = False, forget: bool = False):
    def broken(completion, answer, **_) -> float:
        raise ValueError("the rubric broke")

    rubric = vf.Rubric(funcs=[broken if broken_rubric else exact])
    dataset = Dataset.from_list(SUMS)
    if kind == "single":
        return vf.SingleTurnEnv(dataset=dataset, system_prompt="Answer with the number only.", rubric=rubric)
    if kind == "tool":
        return vf.ToolEnv(dataset=dataset, tools=[add, slow], max_turns=3, rubric=rubric, system_prompt="Use the tools.")
    env = Countdown(dataset=dataset, max_turns=3, rubric=rubric)
    if crash or forget:
        async def setup_state(state):
            state["crash"], state["forget"] = crash, forget
            return state

        env.setup_state = setup_state
    return env


@pytest.fixture(autouse=True)
def env_module(monkeypatch):
    """The envs above as an installed env module would offer them: ``load_environment`` of module MODULE."""
    module = types.ModuleType(MODULE)
    module.load_environment = load_environment
    monkeypatch.setitem(sys.modules, MODULE, module)


def env(kind: str = "single", **config) -> VerifiersEnvironment:
    env_args = config.pop("env_args", {})
    return VerifiersEnvironment({"env_id": MODULE, "env_args": {"kind": kind, **env_args}, **config})


def tasks(environment: VerifiersEnvironment, n: int = 2) -> list[Task]:
    return [Task(**r) for r in environment.demo_records(n, seed=0)]


async def play(environment, task: Task, turns: list[str]):
    episode = await environment.start(task)
    results = []
    try:
        for turn in turns:
            results.append(await episode.step(turn))
        return episode, results, await episode.score()
    finally:
        await episode.close()


def test_the_dataset_becomes_records_that_repeat_per_seed(tmp_path):
    environment = env()
    records = environment.demo_records(4, seed=1)
    assert records == environment.demo_records(4, seed=1)
    assert sorted(r["label"] for r in records) == sorted(s["answer"] for s in SUMS)
    first = records[0]
    assert first["prompt"][0] == {"role": "system", "content": "Answer with the number only."}
    assert first["metadata"]["env"] == "verifiers" and first["metadata"]["env_id"] == MODULE
    out = tmp_path / "train.jsonl"
    argv = ["--env-id", MODULE, "--env-args", '{"kind": "single"}', "--output", str(out), "--seed", "1"]
    assert data.main(argv) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == records


async def test_a_single_turn_env_is_scored_by_its_rubric():
    environment = env()
    task = tasks(environment, 1)[0]
    episode, results, score = await play(environment, task, [f"<think>easy</think>{task.label}"])
    assert episode.conversation.messages[0]["role"] == "system" and episode.conversation.messages[-1]["role"] == "user"
    assert episode.conversation.tools is None
    assert isinstance(results[0], Done) and score.reward == 1.0 and score.breakdown["metrics"]["exact"] == 1.0
    _, _, wrong = await play(environment, task, ["41"])
    assert wrong.reward == 0.0


async def test_a_tool_env_episode_calls_the_tool_and_sees_its_result():
    environment = env("tool")
    task = tasks(environment, 1)[0]
    a, b = (int(x) for x in task.prompt[-1]["content"].removeprefix("What is ").rstrip("?").split(" + "))
    call = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    episode, results, score = await play(environment, task, [call, task.label])
    assert [t["function"]["name"] for t in episode.conversation.tools] == ["add", "slow"]
    observation = results[0]
    assert isinstance(observation, Observation)
    assert observation.messages == [{"role": "tool", "content": str(a + b), "tool_call_id": "call_1_0"}]
    assert isinstance(results[1], Done) and score.reward == 1.0
    assert score.breakdown["metrics"]["total_tool_calls"] == 1.0


async def test_a_malformed_or_unknown_tool_call_is_an_observation():
    environment = env("tool")
    task = tasks(environment, 1)[0]
    _, results, score = await play(environment, task, ['<tool_call>{"name": "add", "arguments": </tool_call>', '<tool_call>{"name": "nope"}</tool_call>'])
    assert all(isinstance(r, Observation) and r.messages[0]["role"] == "tool" for r in results)
    assert score.reward == 0.0


async def test_a_multi_turn_env_asks_again_until_the_answer():
    environment = env("multi")
    assert environment.max_turns == 3
    task = tasks(environment, 1)[0]
    _, results, score = await play(environment, task, ["no idea", task.label])
    assert results[0] == Observation([{"role": "user", "content": "Not yet. Try again."}])
    assert isinstance(results[1], Done) and score.reward == 1.0


async def test_when_our_loop_stops_first_the_rollout_is_scored_as_far_as_it_went():
    environment = env("multi")
    _, results, score = await play(environment, tasks(environment, 1)[0], ["no idea"])
    assert isinstance(results[0], Observation)
    assert (score.reward, score.breakdown["truncated"], score.breakdown["stop"]) == (0.0, True, "prompt_too_long")


@pytest.fixture
def chat(tiny_tokenizer) -> ChatTokens:
    return ChatTokens(tiny_tokenizer)


class RecordingEngine(ScriptedClient):
    """A scripted engine that keeps the ids of every turn it produced."""

    def __init__(self, chat: ChatTokens, turns: list[str]) -> None:
        super().__init__(chat, turns, chat.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        self.produced: list[list[int]] = []

    async def generate(self, input_ids, sampling_params, **kwargs):
        response = await super().generate(input_ids, sampling_params, **kwargs)
        self.produced.append(list(response["output_ids"]))
        return response


def spans(mask: list[int], ids: list[int], value: int) -> list[list[int]]:
    out: list[list[int]] = []
    for i, (m, t) in enumerate(zip(mask, ids, strict=True)):
        if m == value:
            if i == 0 or mask[i - 1] != value:
                out.append([])
            out[-1].append(t)
    return out


async def test_a_tool_env_sample_carries_exactly_the_engines_token_ids(chat):
    environment = env("tool")
    task = tasks(environment, 1)[0]
    engine = RecordingEngine(chat, ['<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>', task.label])
    traj = await run_episode(environment, task, engine, chat, {"temperature": 1.0}, LoopSettings(max_response_tokens=512))
    assert traj.status == COMPLETED and traj.score.reward == 1.0
    assert spans(traj.loss_mask, traj.response_ids, 1) == engine.produced  # the engine's ids, never re-tokenised
    (observation,) = spans(traj.loss_mask, traj.response_ids, 0)
    assert "<tool_response>\n2\n</tool_response>" in chat.tokenizer.decode(observation)  # the tool's result, masked
    rendered = chat.prompt_ids(traj.messages[:2], traj.tools)
    assert traj.prompt_ids == rendered  # the prompt: verifiers' messages and tools through our chat template, once


async def test_a_rubric_that_raises_aborts_the_sample_with_the_reason(chat):
    environment = env(env_args={"broken_rubric": True})
    task = tasks(environment, 1)[0]
    with pytest.raises(EpisodeAborted, match="the rubric broke"):
        await play(environment, task, [task.label])
    traj = await run_episode(environment, task, RecordingEngine(chat, [task.label]), chat, {}, LoopSettings(max_response_tokens=64))
    assert traj.status == ABORTED and "the rubric broke" in traj.error


async def test_an_env_that_raises_or_hangs_aborts_the_sample_with_the_reason(chat):
    environment = env("multi", env_args={"crash": True})
    task = tasks(environment, 1)[0]
    traj = await run_episode(environment, task, RecordingEngine(chat, ["wrong", "wrong"]), chat, {}, LoopSettings(max_response_tokens=64))
    assert traj.status == ABORTED and "env_response crashed" in traj.error

    environment = env("multi", env_args={"forget": True})
    traj = await run_episode(environment, task, RecordingEngine(chat, ["wrong", "wrong"]), chat, {}, LoopSettings(max_response_tokens=64))
    assert traj.status == ABORTED and "rewrote the conversation's history" in traj.error

    environment = env("tool", timeout_s=0.3)
    calls = ['<tool_call>{"name": "slow", "arguments": {"seconds": 1.0}}</tool_call>']
    traj = await run_episode(environment, task, RecordingEngine(chat, calls), chat, {}, LoopSettings(max_response_tokens=128))
    assert traj.status == ABORTED and "did not answer within 0.3 s" in traj.error


async def test_a_turn_limit_of_ours_truncates(chat):
    environment = env("multi", max_turns=1)
    task = tasks(environment, 1)[0]
    traj = await run_episode(environment, task, RecordingEngine(chat, ["wrong"]), chat, {}, LoopSettings(max_response_tokens=64))
    assert traj.status == TRUNCATED and traj.score.breakdown["truncated"]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="needs env_id"):
        VerifiersEnvironment({})
    with pytest.raises(ValueError, match=r"unknown config keys of the verifiers env \['env'\]"):
        VerifiersEnvironment({"env": MODULE})


@pytest.mark.parametrize("kind", ["single", "tool"])
async def test_conforms_and_survives_hostile_turns(kind):
    environment = env(kind)
    await check_environment(environment, tasks(environment), [tasks(environment, 1)[0].label])
    await check_hostile_outputs(environment, tasks(environment, 1), examples=10)


def test_a_hub_env_is_a_stage_by_a_three_line_recipe(tmp_path):
    """The recipe envs/README.md shows: a stage named after the hub env, its data and expert named after it too."""
    import shutil

    from aclarena_slime.recipes.compiler import compile_recipe
    from aclarena_slime.recipes.compose import load_recipe

    recipes = shutil.copytree(REPO / "recipes", tmp_path / "recipes")
    (recipes / "wordle.yaml").write_text(
        "defaults: [verifiers, _self_]\nname: wordle\nenv_config: {verifiers: {env_id: wordle, env_args: {num_train_examples: 100}}}\n"
    )
    recipe = load_recipe(recipes / "wordle.yaml", ["paths.root=/r"])
    assert (recipe.name, recipe.data.env, recipe.data.prompt_data) == ("wordle", "verifiers", "/r/data/wordle/train.jsonl")
    command = compile_recipe(recipe)
    assert command.custom_config["aclarena_lora"]["adapter_name"] == "wordle"
    assert command.custom_config["aclarena_env_config"]["verifiers"]["env_args"] == {"num_train_examples": 100}


def test_a_slime_stage_compiles(tmp_path, capsys):
    from aclarena_slime.launcher.stage import main

    argv = [str(REPO / "recipes" / "verifiers.yaml"), "--dry-run", "backend=slime", f"paths.root={tmp_path}",
            f"env_config.verifiers.env_id={MODULE}"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "--custom-generate-function-path aclarena_slime.slime_edge.rollout.generate" in out


