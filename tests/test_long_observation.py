"""An over-long observation is cut before it is tokenized (issue 44, section 5): a 20 MB passage or customer
reply was tokenized whole on the rollout's event loop (a 40-60 s stall for every episode on it)."""

from __future__ import annotations

import pytest

from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.plugin import registry
from aclarena_slime.plugin.contract import Conversation, Environment, Episode, Observation, Score
from aclarena_slime.slime_edge.rollout import generate
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args

HUGE = "passage " * 250_000  # 2 MB


class HugeObservation(Environment):
    tag = "huge_observation"
    max_turns = 3

    async def start(self, task):
        return HugeEpisode()


class HugeEpisode(Episode):
    def __init__(self) -> None:
        self.conversation = Conversation([{"role": "user", "content": "search for it"}])

    async def step(self, text):
        return Observation([{"role": "user", "content": HUGE}])

    async def score(self):
        return Score(0.0, {})


@pytest.fixture(autouse=True)
def _env():
    registry.register("huge_observation", HugeObservation)


async def test_a_huge_observation_is_cut_before_tokenizing(tiny_checkpoint, tiny_tokenizer, monkeypatch):
    seen: list[int] = []
    original = ChatTokens.observation_text

    def spy(self, observation, last_model_token):
        seen.append(sum(len(m["content"]) for m in observation))
        return original(self, observation, last_model_token)

    monkeypatch.setattr(ChatTokens, "observation_text", spy)
    async with FakeSGLang(tiny_tokenizer, ["<search>x</search>"]) as engine:
        args = make_args(tiny_checkpoint, engine.host, engine.port, rollout_max_response_len=64)
        out = await generate(args, FakeSample(metadata={"env": "huge_observation"}), {"max_new_tokens": 64})
    check_invariants(out)
    assert out.status is FakeSample.Status.TRUNCATED and out.response_length == 64
    assert seen and max(seen) <= 64 * 16, f"{max(seen)} characters were tokenized for at most 64 tokens of room"
    assert out.metadata["aclarena"]["messages"][-1]["content"] == HUGE[: len(out.metadata["aclarena"]["messages"][-1]["content"])]
