"""The authors' search protocol (JSON tool call, tool messages) and their shaped reward, as env options."""

from __future__ import annotations

import pytest

from aclarena_envs.search.config import SearchConfig
from aclarena_envs.search.demo_corpus import generate, write_jsonl
from aclarena_envs.search.env import SearchEnvironment
from aclarena_envs.search.shaped_reward import ShapedInputs, shaped_reward
from aclarena_envs.search.tool_protocol import parse_tool_action, well_formed
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.plugin.conformance import check_environment
from aclarena_slime.plugin.contract import Done, Observation, Task
from aclarena_slime.slime_edge.rollout import generate as rollout_generate
from aclarena_slime.slime_edge.rollout import reward
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args, mask_runs

DEMO = generate(60, seed=5)
QUESTION = DEMO.questions[0]
GOLD = QUESTION.answers[0]
TOOL = {"protocol": "tool_call"}


def call(query: str) -> str:
    return f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{query}"}}}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "kind", "content"),
    [
        (call("capital of France"), "search", "capital of France"),
        ('<tool_call>[{"name": "search", "arguments": "{\\"query\\": \\"x y\\"}"}]</tool_call>', "search", "x y"),
        ("<think>hm</think><answer> Paris </answer>", "answer", "Paris"),
        (call("q") + "<answer>A</answer>", "search", "q"),  # a search call comes first, as in their parser
        ('<tool_call>{"name": "lookup", "arguments": {"query": "q"}}</tool_call>', None, ""),
        ("<tool_call>{not json</tool_call><answer>B</answer>", "answer", "B"),
        ("<tool_call>" * 5000 + "no close", None, ""),
        ('I will search {"name": "search", "arguments": {"query": "bare"}} now', "search", "bare"),
        ('{"arguments": {"query": "first"}, "name": "search"}', "search", "first"),
        ('<tool_call>{"name": "search", "arguments": {"query": "q"}} junk</tool_call>', "search", "q"),
        ('{"name": "lookup", "arguments": {"query": "q"}} <answer> A </answer>', "answer", "A"),
        ("{{}}" * 20000 + "{" * 50000, None, ""),
        ("plain text", None, ""),
    ],
)
def test_parse_tool_action(text, kind, content):
    action = parse_tool_action(text)
    assert (action.kind, action.content) == (kind, content)


@pytest.mark.parametrize(
    ("trajectory", "ok"),
    [
        ("<think>a</think><answer>x</answer>", True),
        ("<tool_call>c</tool_call><tool_response>r</tool_response><answer>x</answer> trailing text", True),
        ("<tool_call>c</tool_call><answer>x</answer>", True),  # their state machine allows it
        ("<tool_call>c</tool_call><tool_response>r</tool_response>", False),  # no answer: incomplete
        ("<answer>x</answer><answer>y</answer>", False),
        ("<tool_response>r</tool_response><answer>x</answer>", False),  # a response nobody called for
        ("<tool_call>c<answer>x</answer></tool_call>", False),
    ],
)
def test_well_formed_follows_the_authors_tag_order(trajectory, ok):
    assert well_formed(trajectory) is ok


@pytest.mark.parametrize(
    ("answer", "formed", "executed", "retrieved", "expected"),
    [
        ("Paris", True, True, [], 1.0),
        ("Paris", False, True, [], 0.7),
        ("Paris", True, False, [], 0.5),
        ("Paris", False, False, [], 0.3),
        (None, False, True, [], -0.05),
        (None, True, False, [], -0.2),
        ("Rome", True, True, ["Doc 1(Title: Paris) the city of paris"], 0.4),
        ("Rome", True, True, ["Doc 1(Title: Rome) nothing"], 0.1),
        ("Rome", True, False, [], -0.05),
        ("Rome", False, True, ["paris"], -0.2),
        ("", True, True, [], 0.1),  # an empty answer is not correct
    ],
)
def test_shaped_reward_table(answer, formed, executed, retrieved, expected):
    inputs = ShapedInputs(answer, ["Paris"], formed, executed, retrieved)
    assert shaped_reward(inputs) == expected


def test_shaped_reward_needs_the_tool_protocol():
    with pytest.raises(ValueError, match="protocol: tool_call"):
        SearchConfig.from_mapping({"reward": "shaped"})
    with pytest.raises(ValueError, match="protocol must be one of"):
        SearchConfig.from_mapping({"protocol": "xml"})


@pytest.mark.parametrize("config", [TOOL, {**TOOL, "reward": "shaped"}])
async def test_tool_protocol_conforms(config):
    env = SearchEnvironment(config)
    tasks = [Task(prompt=QUESTION.question, label={"target": [GOLD]}, metadata={"env": "search"})]
    await check_environment(env, tasks, turns=[call("anything"), "<answer> x </answer>"])
    await env.aclose()


async def test_episode_scores_as_the_authors(tmp_path):
    corpus = write_jsonl(DEMO.passages, tmp_path / "corpus.jsonl")
    env = SearchEnvironment({**TOOL, "reward": "shaped", "corpus": str(corpus), "max_turns": 2})
    assert env.reward_range == (-0.2, 1.0) and env.stop == ("</tool_call>", "</answer>")
    task = Task(prompt=QUESTION.question, label={"target": [GOLD]}, metadata={"env": "search"})

    episode = await env.start(task)
    [user] = episode.conversation.messages
    assert user["content"].startswith("Answer the given question. First conduct reasoning")
    assert user["content"].endswith(f" Question: {QUESTION.question}\n")
    assert episode.conversation.tools[0]["function"]["name"] == "search"
    obs = await episode.step(call(QUESTION.question))
    assert isinstance(obs, Observation) and obs.messages[0]["role"] == "tool"
    assert obs.messages[0]["content"].startswith("Doc 1(Title: ")
    assert isinstance(await episode.step(f"<answer> {GOLD} </answer>"), Done)
    score = await episode.score()
    assert score.reward == 1.0 and score.breakdown["tool_calls"] == 1 and score.breakdown["well_formed"]

    episode = await env.start(task)  # a bare JSON call runs, but breaks the tag order: 0.7, not 1.0
    await episode.step(call(QUESTION.question).removeprefix("<tool_call>").removesuffix("</tool_call>"))
    await episode.step(f"<answer> {GOLD} </answer>")
    score = await episode.score()
    assert score.breakdown["tool_calls"] == 1 and not score.breakdown["well_formed"] and score.reward == 0.7

    episode = await env.start(task)  # a turn with no action ends the episode: truncated, no search
    assert await episode.step("I think it is Paris.") == Done("no_action")
    assert (await episode.score()).reward == -0.2

    episode = await env.start(task)  # the search on the last turn runs and counts (truncated, executed)
    await episode.step(call("anything at all"))
    assert await episode.step(call(QUESTION.question)) == Done("max_turns")
    score = await episode.score()
    assert score.breakdown["searches"] == 2 and score.reward == -0.05
    await env.aclose()


async def test_rollout_renders_results_as_tool_messages(tmp_path, tiny_checkpoint, tiny_tokenizer):
    """Through slime's generate: the tool message is rendered by the chat template, with loss mask 0."""
    corpus = write_jsonl(DEMO.passages, tmp_path / "corpus.jsonl")
    turns = [f"<think>Look it up.</think>\n{call(QUESTION.question)}", f"<answer> {GOLD} </answer>"]
    config = {**TOOL, "reward": "shaped", "corpus": str(corpus)}
    async with FakeSGLang(tiny_tokenizer, turns) as engine:
        args = make_args(
            tiny_checkpoint,
            engine.host,
            engine.port,
            rollout_max_response_len=2048,
            aclarena_env_config={"search": config},
        )
        sample = FakeSample(prompt=QUESTION.question, label={"target": [GOLD]}, metadata={"env": "search"})
        out = await rollout_generate(args, sample, {"temperature": 1.0, "max_new_tokens": 512})
        check_invariants(out)
        assert await reward(args, out) == 1.0
        assert engine.requests[0]["sampling_params"]["stop"][-2:] == ["</tool_call>", "</answer>"]
        prompt = tiny_tokenizer.decode(engine.requests[0]["input_ids"])
        assert '"name": "search"' in prompt and "<tools>" in prompt  # the schema, through the template

    response_ids = out.tokens[len(out.tokens) - out.response_length :]
    assert [value for value, _, _ in mask_runs(out.loss_mask)] == [1, 0, 1]
    (_, a, b), (_, c, d), _ = mask_runs(out.loss_mask)
    observation = tiny_tokenizer.decode(response_ids[c:d])
    [tool_message] = [m for m in out.metadata["aclarena"]["messages"] if m["role"] == "tool"]
    assert observation == ChatTokens(tiny_tokenizer).observation_text([tool_message], response_ids[b - 1])
    assert f"<|im_start|>user\n<tool_response>\n{tool_message['content']}\n</tool_response><|im_end|>" in observation
    assert tiny_tokenizer.decode(response_ids[a:b]) == turns[0]
    assert out.rollout_log_probs[c:d] == [0.0] * (d - c)
    assert out.metadata["aclarena"]["score"]["breakdown"]["tool_calls"] == 1


@pytest.mark.slime
async def test_real_slime_generate_and_rm_then_the_no_tool_filter(tmp_path, tiny_checkpoint, tiny_tokenizer):
    """slime's own generate_and_rm drives the tool protocol; slime's filter call masks the no-tool sample."""
    from slime.rollout.filter_hub.base_types import call_dynamic_filter
    from slime.rollout.sglang_rollout import generate_and_rm
    from slime.utils.types import Sample

    from aclarena_slime.slime_edge.rollout import drop_no_tool
    from aclarena_slime.testing.samples import make_slime_args

    corpus = write_jsonl(DEMO.passages, tmp_path / "corpus.jsonl")
    config = {"search": {**TOOL, "reward": "shaped", "corpus": str(corpus)}}
    plays = [[call(QUESTION.question), f"<answer> {GOLD} </answer>"], [f"<answer> {GOLD} </answer>"]]
    group = []
    for replies in plays:
        async with FakeSGLang(tiny_tokenizer, replies) as engine:
            args = make_slime_args(tiny_checkpoint, engine.host, engine.port, aclarena_env_config=config)
            args.rollout_max_response_len = 2048
            sample = Sample(prompt=QUESTION.question, label={"target": [GOLD]}, metadata={"env": "search"})
            params = {"temperature": 1.0, "max_new_tokens": 512, "no_stop_trim": True}
            group.append(await generate_and_rm(args, sample, params))
    assert [s.reward for s in group] == [1.0, 0.5]  # searched vs answered directly (well formed both)
    output = call_dynamic_filter(drop_no_tool, args, group)
    assert output.keep and 1 in group[0].loss_mask and set(group[1].loss_mask) == {0}
