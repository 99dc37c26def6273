"""A retail episode through the real slime-facing functions: fake SGLang policy, scripted customer."""

from __future__ import annotations

import json

from aiohttp import web

from aclarena_slime.http_service import serving
from aclarena_slime.slime_edge.rollout import generate, reward
from aclarena_slime.testing.fake_sglang import FakeSGLang, fake_logprob
from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args, mask_runs

S = FakeSample.Status

CANCEL = '<tool_call>\n{"name": "cancel_pending_order", "arguments": {"order_id": "#W1", "reason": "no longer needed"}}\n</tool_call>'
LOOKUP = '<tool_call>\n{"name": "find_user_id_by_email", "arguments": {"email": "ann@example.com"}}\n</tool_call>'
CUSTOMER = ["Hi, please cancel #W1, I no longer need it.", "Yes, please cancel it.", "Thanks! ###STOP###"]


def _args(tiny_checkpoint, engine, tiny_data, user):
    config = {"retail": {"data_dir": str(tiny_data), "max_turns": 8, "user": user}}
    return make_args(
        tiny_checkpoint, engine.host, engine.port, rollout_max_response_len=4096, aclarena_env_config=config
    )


def _sample():
    return FakeSample(
        prompt="tau3-retail task t0", label="t0", metadata={"env": "retail", "task_id": "t0", "split": "train"}
    )



async def test_retail_episode_masks_tools_and_customer_and_scores(tiny_checkpoint, tiny_tokenizer, tiny_data):
    replies = [
        LOOKUP,
        "<think>confirm first</think>I will cancel order #W1. Shall I proceed?",
        CANCEL,
        "Order #W1 is cancelled.",
    ]
    async with FakeSGLang(tiny_tokenizer, replies) as engine:
        args = _args(tiny_checkpoint, engine, tiny_data, {"kind": "scripted", "replies": CUSTOMER})
        out = await generate(args, _sample(), {"temperature": 1.0})
        score = await reward(args, out)
    check_invariants(out)
    assert out.status is S.COMPLETED and len(engine.requests) == 4
    record = out.metadata["aclarena"]
    assert record["end"] == "user_stop" and score == 1.0
    assert record["score"]["breakdown"]["db"]["match"] is True
    assert [m["role"] for m in record["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]

    # the prompt: policy, tools and the customer's first message, through the chat template
    prompt_len = len(engine.requests[0]["input_ids"])
    prompt = tiny_tokenizer.decode(engine.requests[0]["input_ids"])
    assert "Tiny retail policy" in prompt and '"name": "cancel_pending_order"' in prompt and CUSTOMER[0] in prompt

    # model turns: mask 1 with the engine's log-probs; tool answers and customer turns: mask 0
    response = out.tokens[prompt_len:]
    runs = mask_runs(out.loss_mask)
    assert [v for v, _, _ in runs] == [1, 0, 1, 0, 1, 0, 1]
    masked = [tiny_tokenizer.decode(response[a:b]) for v, a, b in runs if v == 0]
    assert "<tool_response>" in masked[0] and "ann_lee_1" in masked[0]
    assert CUSTOMER[1] in masked[1] and "<tool_response>" not in masked[1]
    assert '"status": "cancelled"' in masked[2]
    trained = [tiny_tokenizer.decode(response[a:b]) for v, a, b in runs if v == 1]
    assert "find_user_id_by_email" in trained[0] and "Shall I proceed?" in trained[1]
    assert all(CUSTOMER[1] not in t and "<tool_response>" not in t for t in trained)
    for _, a, b in (r for r in runs if r[0] == 1):
        assert out.rollout_log_probs[a:b] == [fake_logprob(i, t) for i, t in enumerate(response[a:b])]
    assert all(lp == 0.0 for v, a, b in runs if v == 0 for lp in out.rollout_log_probs[a:b])
    # each request is exactly everything so far
    for request in engine.requests[1:]:
        assert request["input_ids"] == out.tokens[: len(request["input_ids"])]


async def test_wrong_action_scores_zero(tiny_checkpoint, tiny_tokenizer, tiny_data):
    wrong = CANCEL.replace("no longer needed", "ordered by mistake")
    async with FakeSGLang(tiny_tokenizer, [wrong, "Done, it is cancelled."]) as engine:
        args = _args(tiny_checkpoint, engine, tiny_data, {"kind": "scripted", "replies": ["Cancel #W1."]})
        out = await generate(args, _sample(), {"temperature": 1.0})
        assert await reward(args, out) == 0.0
    assert out.status is S.COMPLETED
    breakdown = out.metadata["aclarena"]["score"]["breakdown"]
    assert breakdown["db"]["match"] is False and json.dumps(breakdown)


async def test_failing_simulator_aborts_the_sample_instead_of_scoring_it(tiny_checkpoint, tiny_tokenizer, tiny_data):
    async with serving(web.Application()) as gone:
        pass  # a port that was just released: connection refused
    async with FakeSGLang(tiny_tokenizer, ["Hello, how can I help?"]) as engine:
        args = _args(
            tiny_checkpoint, engine, tiny_data, {"kind": "llm", "base_url": f"{gone}/v1", "model": "user", "retries": 0}
        )
        out = await generate(args, _sample(), {"temperature": 1.0})
    assert engine.requests == []  # the policy was never asked: the customer never spoke
    assert out.status is S.ABORTED and out.remove_sample
    assert "user simulator" in out.metadata["aclarena"]["error"] and "score" not in out.metadata["aclarena"]


async def test_a_lone_surrogate_escape_in_a_tool_call_is_an_error_observation(
    tiny_checkpoint, tiny_tokenizer, tiny_data
):
    """``{"name": "\\ud800"}`` (plain ASCII in the model's text) decoded to a lone surrogate that the tool
    answer echoed; the chat template's tokenizer raised and the sample was removed: a reward-free exit."""
    turns = [
        '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W\\udfff"}}</tool_call>',
        "Goodbye.",
    ]
    async with FakeSGLang(tiny_tokenizer, turns) as engine:
        args = _args(tiny_checkpoint, engine, tiny_data, {"kind": "scripted", "replies": ["Hi.", "Bye ###STOP###"]})
        out = await generate(args, _sample(), {"temperature": 1.0})
        assert await reward(args, out) == 0.0
    check_invariants(out)
    assert out.status is S.COMPLETED and not out.remove_sample, out.metadata["aclarena"].get("error")
    tool_answers = [m["content"] for m in out.metadata["aclarena"]["messages"] if m["role"] == "tool"]
    assert len(tool_answers) == 2 and all(a.startswith("Error: ") for a in tool_answers)
    assert all(a.encode("utf-8") for a in tool_answers)
