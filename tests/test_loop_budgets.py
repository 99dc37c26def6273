"""Per-turn response budgets and the total context cap, through the rollout path with the fake engine.

The authors give each model turn its own ``max_new_tokens`` (search 4096, retail 2048: WillDreamer/ACLArena
``generate_with_search_tools_qwen_sft_no_drift.py:776-791``, ``tau-bench/trainable_agents.py:445,589``);
a long retail episode must not run out of budget after a few turns, and the whole context stays capped.
"""

from __future__ import annotations

import pytest

from aclarena_slime.agent_loop import LoopSettings, Trajectory
from aclarena_slime.plugin import registry
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Observation, Score
from aclarena_slime.rollout import Budgets, loop_settings
from aclarena_slime.slime_edge.rollout import build_context, generate
from aclarena_slime.testing.fake_sglang import FakeSGLang, fake_logprob
from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args

S = FakeSample.Status
TURNS = 30


class LongChat(Environment):
    """A user who answers every turn and hangs up after the 30th (a long retail conversation)."""

    tag = "long_chat"
    max_turns = TURNS

    async def start(self, task):
        return LongEpisode()


class LongEpisode(Episode):
    def __init__(self) -> None:
        self.conversation = Conversation([{"role": "user", "content": "hello"}])
        self.n = 0

    async def step(self, text):
        self.n += 1
        if self.n == TURNS:
            return Done("user_left")
        return Observation([{"role": "user", "content": f"and then {self.n}?"}])

    async def score(self):
        return Score(1.0, {"turns": self.n})


@pytest.fixture(autouse=True)
def _long_chat_env():
    registry.register("long_chat", LongChat)


def _args(ckpt, engine, **kw):
    return make_args(ckpt, engine.host, engine.port, **kw)


def _model_spans(sample):
    """(start, end) of each run of loss-mask-1 tokens: one per model turn."""
    spans, start = [], None
    for i, m in enumerate([*sample.loss_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


async def test_thirty_turn_episode_is_not_truncated_by_a_per_turn_budget(tiny_checkpoint, tiny_tokenizer):
    reply = "sure, one moment please"  # ~6 tokens + end of turn
    async with FakeSGLang(tiny_tokenizer, [reply]) as engine:
        args = _args(tiny_checkpoint, engine, aclarena_response_budget="per_turn", rollout_max_context_len=4096)
        out = await generate(args, FakeSample(metadata={"env": "long_chat"}), {"max_new_tokens": 16})
    check_invariants(out)
    assert out.status is S.COMPLETED, out.metadata["aclarena"]["end"]
    assert len(engine.requests) == TURNS
    # each turn asked for its own 16 tokens, whatever the turns before spent
    assert {r["sampling_params"]["max_new_tokens"] for r in engine.requests} == {16}
    assert out.response_length > 16 * 3, "the whole episode is far longer than one turn's budget"
    # loss mask / log-prob invariants: each model turn's tokens carry the engine's log-probs, observations 0.0
    prompt_len = len(engine.requests[0]["input_ids"])
    spans = _model_spans(out)
    assert len(spans) == TURNS
    for start, end in spans:
        ids = out.tokens[prompt_len + start : prompt_len + end]
        assert out.rollout_log_probs[start:end] == [fake_logprob(i, t) for i, t in enumerate(ids)]
    assert all(lp == 0.0 for lp, m in zip(out.rollout_log_probs, out.loss_mask, strict=True) if m == 0)
    # every request is the exact token prefix of the final sample (token-in/token-out, nothing re-tokenized)
    for request in engine.requests:
        assert out.tokens[: len(request["input_ids"])] == request["input_ids"]


async def test_the_same_episode_under_one_total_budget_truncates_early(tiny_checkpoint, tiny_tokenizer):
    """What the per-turn setting fixes: a single budget spent by all turns and observations."""
    async with FakeSGLang(tiny_tokenizer, ["sure, one moment please"]) as engine:
        args = _args(tiny_checkpoint, engine)  # aclarena_response_budget unset: total
        out = await generate(args, FakeSample(metadata={"env": "long_chat"}), {"max_new_tokens": 64})
    check_invariants(out)
    assert out.status is S.TRUNCATED and out.response_length == 64
    assert len(engine.requests) < 6


@pytest.mark.parametrize("cap", [120, 161, 200])
async def test_the_total_context_cap_holds(tiny_checkpoint, tiny_tokenizer, cap):
    async with FakeSGLang(tiny_tokenizer, ["sure, one moment please"]) as engine:
        args = _args(tiny_checkpoint, engine, aclarena_response_budget="per_turn", rollout_max_context_len=cap)
        out = await generate(args, FakeSample(metadata={"env": "long_chat"}), {"max_new_tokens": 16})
    check_invariants(out)
    assert len(out.tokens) <= cap
    assert out.status is S.TRUNCATED and out.metadata["aclarena"]["end"] == "context_limit"
    for request in engine.requests:  # no request may ask for more than fits in the context
        assert len(request["input_ids"]) + request["sampling_params"]["max_new_tokens"] <= cap
        assert request["sampling_params"]["max_new_tokens"] <= 16
    assert out.metadata["aclarena"]["score"]["reward"] == 1.0  # truncated episodes are still scored


async def test_a_turn_cut_by_its_own_budget_ends_the_episode_as_truncated(tiny_checkpoint, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, ["a rambling reply " * 20]) as engine:
        args = _args(tiny_checkpoint, engine, aclarena_response_budget="per_turn")
        out = await generate(args, FakeSample(metadata={"env": "long_chat"}), {"max_new_tokens": 8})
    check_invariants(out)
    assert out.status is S.TRUNCATED and out.metadata["aclarena"]["end"] == "turn_budget"
    assert out.response_length == 8


def test_eval_context_cap_wins_in_evaluation():

    budgets = Budgets(max_response_len=2048, mode="per_turn", max_context_len=32768, eval_max_context_len=8192)
    assert loop_settings(budgets, {}, evaluation=True).max_context_tokens == 8192
    train = loop_settings(budgets, {})
    assert (train.max_turn_tokens, train.max_response_tokens, train.max_context_tokens) == (2048, None, 32768)


def test_an_unset_budget_mode_bounds_the_whole_trajectory():
    """``mode=None`` (an unset ``aclarena_response_budget``) is ``total``, as its one check reads it."""
    settings = loop_settings(Budgets(max_response_len=16, mode=None), {})  # type: ignore[arg-type]
    assert (settings.max_response_tokens, settings.max_turn_tokens) == (16, None)


def test_bad_settings_are_clear_errors(tiny_checkpoint):
    from types import SimpleNamespace

    args = SimpleNamespace(
        sglang_router_ip="127.0.0.1", sglang_router_port=1, hf_checkpoint=str(tiny_checkpoint),
        rollout_max_response_len=8, aclarena_response_budget="per_episode",
    )  # fmt: skip
    with pytest.raises(ValueError, match="aclarena_response_budget"):
        build_context(args)
    with pytest.raises(ValueError, match="max_context_tokens"):
        LoopSettings(max_response_tokens=8, max_context_tokens=0)
    with pytest.raises(ValueError, match="response budget"):
        LoopSettings(max_response_tokens=None)
    room, why = LoopSettings(max_response_tokens=None, max_turn_tokens=4).turn_budget(Trajectory())
    assert (room, why) == (4, "turn_budget")


async def test_evaluation_keeps_the_task_reward(tiny_checkpoint, tiny_tokenizer):
    """slime skips the reward model for a sample with a reward: MOPD's evaluation scores the task, not the KL."""
    async with FakeSGLang(tiny_tokenizer, ["\\boxed{4}"]) as engine:
        args = _args(tiny_checkpoint, engine)
        sample = FakeSample(prompt="2+2?", label="4", metadata={"env": "math"})
        out = await generate(args, sample, {"max_new_tokens": 32}, evaluation=True)
        train = await generate(args, FakeSample(prompt="2+2?", label="4", metadata={"env": "math"}), {})
    assert out.reward == 1.0
    assert train.reward is None  # training leaves the reward to the reward model (--custom-rm-path)
