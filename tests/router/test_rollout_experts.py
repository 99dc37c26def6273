"""Mixed-tag samples through the real rollout: each request carries its env's expert as ``lora_path``,
straight to an engine and through the gateway in front of two engines."""

from __future__ import annotations

import asyncio
import re

import pytest

from aclarena_slime.plugin import registry
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Score
from aclarena_slime.slime_edge.rollout import generate
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args

from .conftest import TAGS, gateway

# The real math plugin; one-turn stand-ins for the plugins whose services (retriever, user simulator,
# τ³ data) a unit test does not start. Routing depends only on the tag.
STANDINS = ("search", "retail", "ifeval")


class _OneTurn(Episode):
    def __init__(self, prompt: str) -> None:
        self.conversation = Conversation([{"role": "user", "content": prompt}])

    async def step(self, text: str) -> Done:
        return Done("answered")

    async def score(self) -> Score:
        return Score(1.0, {})


def _standin(tag: str) -> type[Environment]:
    class StandIn(Environment):
        async def start(self, task):
            return _OneTurn(str(task.prompt))

    StandIn.tag = tag
    return StandIn


@pytest.fixture
def standins(monkeypatch):
    for tag in STANDINS:
        monkeypatch.setitem(registry._registered, tag, _standin(tag))
    # a config of their own keeps these instances apart from the real plugins' in the registry cache
    return {tag: {"router_test": True} for tag in STANDINS}


def _samples() -> list[FakeSample]:
    return [
        FakeSample(index=i, prompt=f"question {i}", label="4", metadata={"env": TAGS[i % len(TAGS)]}) for i in range(12)
    ]


async def _roll(args) -> list[FakeSample]:
    params = {"temperature": 1.0, "max_new_tokens": 32}
    return await asyncio.gather(*(generate(args, s, dict(params)) for s in _samples()))


def _by_sample(engines) -> dict[int, str]:
    """Sample index (from its prompt) → lora_path, read from what the engines received."""
    seen = {}
    for engine in engines:
        for request in engine.requests:
            index = int(re.search(r"question (\d+)", engine.tokenizer.decode(request["input_ids"])).group(1))
            seen[index] = request["lora_path"]
    return seen


def _check(samples, engines) -> None:
    for sample in samples:
        check_invariants(sample)
    routed = _by_sample(engines)
    assert routed == {i: f"{TAGS[i % len(TAGS)]}-expert" for i in range(12)}


async def test_mixed_batch_straight_to_one_engine(tiny_checkpoint, tiny_tokenizer, manifest, standins):
    async with FakeSGLang(tiny_tokenizer, ["\\boxed{4}"]) as engine:
        args = make_args(
            tiny_checkpoint, engine.host, engine.port, aclarena_experts=str(manifest), aclarena_env_config=standins
        )
        samples = await _roll(args)
    _check(samples, [engine])
    math = [s for s in samples if s.metadata["env"] == "math"]
    assert all(s.metadata["aclarena"]["score"]["reward"] == 1.0 for s in math)


async def test_mixed_batch_through_the_gateway(tiny_checkpoint, tiny_tokenizer, manifest, standins):
    async with FakeSGLang(tiny_tokenizer, ["\\boxed{4}"]) as a, FakeSGLang(tiny_tokenizer, ["\\boxed{4}"]) as b:
        async with gateway([a.url, b.url], manifest) as (url, _):
            host, port = url.removeprefix("http://").rsplit(":", 1)
            args = make_args(
                tiny_checkpoint, host, int(port), aclarena_experts=str(manifest), aclarena_env_config=standins
            )
            samples = await _roll(args)
    _check(samples, [a, b])
    assert a.requests and b.requests, "both engines served part of the batch"
