"""The authors' retail reward shaping as an env option: bad format, truncation and aborts each get a value."""

from __future__ import annotations

import pytest

from aclarena_envs.retail.env import RetailEnvironment
from aclarena_envs.retail.gold import tool_call_text
from aclarena_envs.retail.shaping import RetailShaping, turn_well_formed
from aclarena_slime.plugin.conformance import check_environment
from aclarena_slime.plugin.contract import Done, Task


def task(task_id: str) -> Task:
    return Task(prompt=f"tau3-retail task {task_id}", label=task_id, metadata={"env": "retail", "task_id": task_id})


def call(name: str, **arguments) -> str:
    return tool_call_text({"name": name, "arguments": arguments})


CANCEL = call("cancel_pending_order", order_id="#W1", reason="no longer needed")


def shaped_env(tiny_data, replies, **extra) -> RetailEnvironment:
    config = {"data_dir": str(tiny_data), "user": {"kind": "scripted", "replies": replies}, "shaping": {}, **extra}
    return RetailEnvironment(config)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("Your order is cancelled.", True),
        ("<think>plan</think>Your order is cancelled.", True),
        ("  <think>plan</think>\n" + CANCEL + "\n", True),
        (CANCEL + CANCEL, False),  # one call per turn
        ("Sure. " + CANCEL, False),  # text around a call is leftover markup
        ("<think>a</think><think>b</think>ok", False),
        ("<think>never closed", False),
        ("ok <|im_end|>", False),
        ("", False),
    ],
)
def test_turn_format_rule(text, ok):
    assert turn_well_formed(text) is ok


def test_shaping_values_and_range():
    shaping = RetailShaping.from_config({})
    assert shaping == RetailShaping(0.1, 0.0, -0.2, -0.3) and shaping.reward_range == (-0.3, 1.0)
    assert RetailShaping.from_config(None) is None
    with pytest.raises(ValueError, match="unknown retail env shaping keys"):
        RetailShaping.from_config({"abort": -0.3})
    with pytest.raises(ValueError, match="shaping.truncated"):
        RetailShaping.from_config({"truncated": "low"})


async def test_success_with_a_malformed_turn_pays_the_format_penalty(tiny_data):
    env = shaped_env(tiny_data, ["Cancel #W1, I no longer need it.", "Yes.", "Thanks ###STOP###"])
    episode = await env.start(task("t0"))
    await episode.step("Sure. " + call("find_user_id_by_email", email="ann@example.com"))  # malformed, still runs
    await episode.step("Cancel #W1? Confirm.")
    await episode.step(CANCEL)
    assert await episode.step("Done.") == Done("user_stop")
    score = await episode.score()
    assert score.breakdown["task_reward"] == 1.0 and score.breakdown["format_bad_turns"] == 1
    assert score.reward == pytest.approx(0.9)


async def test_failure_with_a_malformed_turn_pays_nothing_more(tiny_data):
    env = shaped_env(tiny_data, ["Cancel #W1.", "Bye ###STOP###"])
    episode = await env.start(task("t0"))
    await episode.step("<think>x</think><think>y</think>I cannot help.")
    await episode.step("Bye.")
    score = await episode.score()
    assert score.breakdown["task_reward"] == 0.0 and score.reward == 0.0


async def test_truncated_and_aborted_get_their_own_values(tiny_data):
    env = shaped_env(tiny_data, ["Cancel #W1.", "Which order?", "Hm."])
    truncated = await env.start(task("t0"))  # the episode ran out of turns: the customer never stopped
    await truncated.step(CANCEL)  # even the right write does not count
    score = await truncated.score()
    assert score.reward == -0.2 and score.breakdown["task_reward"] == 1.0 and score.breakdown["end"] == "turn_limit"

    aborted = await env.start(task("t0"))
    assert await aborted.step("<tool_call>{not json</tool_call>") == Done("malformed_turn")
    score = await aborted.score()
    assert score.reward == -0.3 and score.breakdown["end"] == "malformed_turn"
    empty = await env.start(task("t0"))
    assert await empty.step("<think>only thinking</think>") == Done("malformed_turn")


async def test_without_shaping_a_malformed_call_is_an_observation(tiny_data):
    env = RetailEnvironment({"data_dir": str(tiny_data), "user": {"kind": "scripted", "replies": ["Cancel #W1."]}})
    episode = await env.start(task("t0"))
    obs = await episode.step("<tool_call>{not json</tool_call>")
    assert obs.messages[0]["content"].startswith("Error:")
    assert (await episode.score()).reward == 0.0 and env.reward_range == (0.0, 1.0)


async def test_shaped_env_conforms(tiny_data):
    env = shaped_env(tiny_data, ["Cancel #W1.", "Yes.", "Thanks ###STOP###"] * 40)
    assert env.reward_range == (-0.3, 1.0)
    await check_environment(env, [task("t0")], turns=[CANCEL])


async def test_shaped_group_through_the_rollout_and_the_task_variance_filter(
    tiny_checkpoint, tiny_tokenizer, tiny_data
):
    """Through slime's generate: a success, a truncated and an aborted episode; the filter reads the
    task outcome (1, 1, 0), not the shaped rewards."""
    from types import SimpleNamespace

    from aclarena_slime.slime_edge.rollout import generate, reward, task_reward_nonzero_std
    from aclarena_slime.testing.fake_sglang import FakeSGLang
    from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args

    customer = {"kind": "scripted", "replies": ["Cancel #W1, I no longer need it.", "Thanks ###STOP###"]}
    plays = {"success": [CANCEL, "Cancelled."], "truncated": [CANCEL], "aborted": ["<tool_call>{bad</tool_call>"]}
    outs = {}
    for name, replies in plays.items():
        config = {"retail": {"data_dir": str(tiny_data), "user": customer, "shaping": {}, "max_turns": len(replies)}}
        async with FakeSGLang(tiny_tokenizer, replies) as engine:
            args = make_args(
                tiny_checkpoint, engine.host, engine.port, rollout_max_response_len=4096, aclarena_env_config=config
            )
            sample = FakeSample(prompt="t", label="t0", metadata={"env": "retail", "task_id": "t0"})
            out = await generate(args, sample, {"temperature": 1.0})
            outs[name] = (out, await reward(args, out))
        check_invariants(out)
    assert {name: r for name, (_, r) in outs.items()} == {"success": 1.0, "truncated": -0.2, "aborted": -0.3}
    assert not any(out.remove_sample for out, _ in outs.values()), "the agent's own failures are trained on"
    group = [out for out, _ in outs.values()]
    assert _keep(task_reward_nonzero_std(SimpleNamespace(), group))
    assert not _keep(task_reward_nonzero_std(SimpleNamespace(), group[:2]))  # both succeeded at the task


def _keep(output) -> bool:
    return output if isinstance(output, bool) else output.keep


@pytest.mark.slow
async def test_gold_play_keeps_reward_one_under_shaping_on_real_data(real_data):
    """The authors' format rule accepts every gold turn: shaping changes no reward of τ³'s 114 gold plays."""
    import json

    from aclarena_envs.retail.data import RetailData
    from aclarena_envs.retail.gold import play_gold
    from aclarena_envs.retail.user_sim import ScriptedUser

    data = RetailData.load(real_data)
    user = ScriptedUser(["Hello, I need help with an order."])
    env = RetailEnvironment({"shaping": {}}, user_simulator=user, data=data)
    tasks = json.loads((real_data / "tasks.json").read_text())
    results = [(await play_gold(env, t)).score for t in tasks]
    assert len(results) == 114
    assert all(s.reward == 1.0 and s.breakdown["format_bad_turns"] == 0 for s in results)
