"""Retail turns as the authors' agent reads them (``turn_parsing: authors``), beside our strict reading.

The authors' outcomes follow their agent (tau-bench/trainable_agents.py) and the tool parser of the SGLang
they pin (0.5.7, ``Qwen25Detector``): a call is ``<tool_call>\\n{JSON}\\n</tool_call>``; a block that does not
decode or names no known tool is skipped; no call left means the whole text goes to the customer.
"""

from __future__ import annotations

import pytest

from aclarena_envs.retail.data import RetailData
from aclarena_envs.retail.env import RetailEnvironment
from aclarena_envs.retail.user_sim import ScriptedUser, UserSession, UserSimulator
from aclarena_slime.plugin.contract import Done, EpisodeAborted, Observation, Task

LOOKUP_JSON = '{"name": "find_user_id_by_email", "arguments": {"email": "ann@example.com"}}'
CALL = f"<tool_call>\n{LOOKUP_JSON}\n</tool_call>"
TASK = Task(prompt="tau3-retail task t0", label="t0", metadata={"env": "retail", "task_id": "t0"})


async def _step(tiny_data, mode: str, text: str):
    """One turn in ``mode`` (shaping on, as the paper recipes): what came back and what the customer heard."""
    user = ScriptedUser(["Hi, I need help.", "Sure.", "Thanks."])
    config = {"turn_parsing": mode, "shaping": {}, "first_call_only": True}
    env = RetailEnvironment(config, user_simulator=user, data=RetailData.load(tiny_data))
    episode = await env.start(TASK)
    result = await episode.step(text)
    heard = episode.user.heard[1:]  # [0] is the greeting
    return result, heard, episode


def _tool_names(result) -> list[str]:
    assert isinstance(result, Observation), result
    return [m.get("name") for m in result.messages if m["role"] == "tool"]


def _said(result, heard, text) -> bool:
    """The turn went to the customer, whole, and the episode goes on."""
    return isinstance(result, Observation) and heard == [text] and result.messages[0]["role"] == "user"


async def test_1_a_well_formed_call_runs_in_both(tiny_data):
    text = f"<think>Look the user up.</think>\n{CALL}"
    for mode in ("authors", "strict"):
        result, heard, _ = await _step(tiny_data, mode, text)
        assert _tool_names(result) == ["find_user_id_by_email"] and heard == []


async def test_2_a_reply_reaches_the_customer_with_its_thinking_for_the_authors(tiny_data):
    text = "<think>Greet first.</think>Hello! How can I help?"
    result, heard, _ = await _step(tiny_data, "authors", text)
    assert _said(result, heard, text)  # the parser's normal_text is the raw turn
    result, heard, _ = await _step(tiny_data, "strict", text)
    assert heard == ["Hello! How can I help?"]


async def test_3_malformed_json_is_said_to_the_customer_and_the_episode_goes_on(tiny_data):
    text = '<tool_call>\n{"name": "find_user_id_by_email", "arguments": {"email": \n</tool_call>'
    result, heard, _ = await _step(tiny_data, "authors", text)
    assert _said(result, heard, text)
    result, _, episode = await _step(tiny_data, "strict", text)
    assert result == Done("malformed_turn") and (await episode.score()).reward == -0.3


async def test_4_a_thinking_only_turn_is_said_to_the_customer(tiny_data):
    text = "<think>I am not sure what to do.</think>"
    result, heard, _ = await _step(tiny_data, "authors", text)
    assert _said(result, heard, text)
    result, _, _ = await _step(tiny_data, "strict", text)
    assert result == Done("malformed_turn")


async def test_5_an_empty_turn_is_said_to_the_customer(tiny_data):
    result, heard, _ = await _step(tiny_data, "authors", "")
    assert _said(result, heard, "")
    result, _, _ = await _step(tiny_data, "strict", "")
    assert result == Done("malformed_turn")


async def test_6_an_unknown_tool_is_said_to_the_customer(tiny_data):
    text = '<tool_call>\n{"name": "refund_everything", "arguments": {}}\n</tool_call>'
    result, heard, _ = await _step(tiny_data, "authors", text)
    assert _said(result, heard, text)  # the detector skips undefined functions
    result, heard, _ = await _step(tiny_data, "strict", text)
    assert heard == [] and result.messages[0]["content"] == "Error: Tool 'refund_everything' not found."


async def test_7_no_newline_before_the_closing_tag_is_no_call(tiny_data):
    text = f"<tool_call>\n{LOOKUP_JSON}</tool_call>"
    result, heard, _ = await _step(tiny_data, "authors", text)
    assert _said(result, heard, text)  # qwen25's end token is "\n</tool_call>"
    result, _, _ = await _step(tiny_data, "strict", text)
    assert _tool_names(result) == ["find_user_id_by_email"]


async def test_8_a_call_inside_the_thinking_runs_for_the_authors(tiny_data):
    text = f"<think>I could do {CALL} but first</think>Let me check."
    result, heard, _ = await _step(tiny_data, "authors", text)
    assert _tool_names(result) == ["find_user_id_by_email"] and heard == []
    result, heard, _ = await _step(tiny_data, "strict", text)
    assert heard == ["Let me check."]  # ours reads calls after the thinking only


async def test_json_that_is_not_an_object_makes_the_parser_raise_and_aborts(tiny_data):
    result, heard, episode = await _step(tiny_data, "authors", '<tool_call>\n"find_user_id_by_email"\n</tool_call>')
    assert result == Done("malformed_turn") and heard == []
    assert (await episode.score()).reward == -0.3


async def test_arguments_that_are_not_an_object_send_the_text_before_the_call(tiny_data):
    text = 'Checking.\n<tool_call>\n{"name": "find_user_id_by_email", "arguments": "ann@example.com"}\n</tool_call>'
    result, heard, _ = await _step(tiny_data, "authors", text)
    assert _said(result, heard, "Checking.")


async def test_only_the_first_of_two_calls_runs_and_text_before_it_is_not_said(tiny_data):
    text = f"Let me look.\n{CALL}\n<tool_call>\n{{\"name\": \"get_order_details\", \"arguments\": {{\"order_id\": \"#W1\"}}}}\n</tool_call>"
    result, heard, episode = await _step(tiny_data, "authors", text)
    assert _tool_names(result) == ["find_user_id_by_email"] and heard == [] and episode.agent_messages == []


def test_authors_mode_stops_every_turn_at_the_first_call_end(tiny_data):
    data = RetailData.load(tiny_data)
    user = ScriptedUser([])
    assert RetailEnvironment({"turn_parsing": "authors"}, user_simulator=user, data=data).stop == ("</tool_call>",)
    assert RetailEnvironment({}, user_simulator=user, data=data).stop == ()
    with pytest.raises(ValueError, match="turn_parsing must be one of strict, authors"):
        RetailEnvironment({"turn_parsing": "loose"}, user_simulator=user, data=data)


class _FailsAtGreeting(UserSimulator):
    def session(self, scenario: str) -> UserSession:
        return _Fails()


class _Fails(UserSession):
    async def reply(self, agent_text: str) -> str:
        raise EpisodeAborted("user simulator failed after 9 attempts")


async def test_a_customer_failing_at_the_greeting_aborts_the_start_even_with_user_failure_scored(tiny_data):
    env = RetailEnvironment(
        {"shaping": {"user_failure": -0.3}, "turn_parsing": "authors"},
        user_simulator=_FailsAtGreeting(),
        data=RetailData.load(tiny_data),
    )
    with pytest.raises(EpisodeAborted):
        await env.start(TASK)


async def test_a_greeting_failure_is_a_zero_gradient_sample_with_reward_0_in_its_group(tiny_checkpoint, tiny_data):
    """Through the slime hooks with the paper's retail settings: nothing is generated, the sample is removed (slime
    zeroes its loss), and the reward it trains with is 0.0, as the authors' no-op sample."""
    from aclarena_slime.slime_edge.rollout import generate, reward_post_process
    from aclarena_slime.testing.fake_sglang import FakeSGLang
    from aclarena_slime.testing.samples import FakeSample, make_args

    async with FakeSGLang(None, ["unused"]) as engine:
        dead = f"http://{engine.host}:1/v1"  # nothing listens on port 1: the greeting fails at once
        user = {"kind": "llm", "base_url": dead, "model": "user_sim", "retries": 0, "timeout_s": 5}
        config = {"retail": {"data_dir": str(tiny_data), "user": user, "turn_parsing": "authors",
                             "shaping": {"user_failure": -0.3}}}  # fmt: skip
        args = make_args(tiny_checkpoint, engine.host, engine.port, aclarena_env_config=config)
        sample = FakeSample(prompt="tau3-retail task t0", label="t0", metadata={"env": "retail", "task_id": "t0"})
        out = await generate(args, sample, {"temperature": 1.0})
        assert engine.requests == []
    assert out.remove_sample and out.status is FakeSample.Status.ABORTED and sum(out.loss_mask) == 0
    group = [out]
    for reward in (1.0, 0.0):
        kept = FakeSample(prompt="p", label="t0", metadata={"env": "retail"})
        kept.reward = reward
        group.append(kept)
    args.advantage_estimator, args.n_samples_per_prompt = "gspo", 3
    _, trained = reward_post_process(args, group)
    assert trained[0] == 0.0 and trained[1] == pytest.approx(-trained[2]) and trained[1] > 0.5
