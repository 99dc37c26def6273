"""One rollout context per slime process: built on the first call, shared, and closed (env ``aclose``) at the end."""

from __future__ import annotations

import asyncio

from aclarena_slime.plugin import registry
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Score
from aclarena_slime.slime_edge import rollout as edge
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.loops import background_loop
from aclarena_slime.testing.samples import FakeSample, make_args

PARAMS = {"temperature": 1.0, "max_new_tokens": 64}


class Counted(Environment):
    """An env that counts how often it is built and closed."""

    tag = "counted"
    built = 0
    closed = 0

    def __init__(self, config=None) -> None:
        type(self).built += 1

    async def start(self, task):
        return OneTurn()

    async def aclose(self) -> None:
        type(self).closed += 1


class OneTurn(Episode):
    conversation = Conversation([{"role": "user", "content": "say something"}])

    async def step(self, text):
        return Done()

    async def score(self):
        return Score(1.0, {})


def _counted(monkeypatch):
    monkeypatch.setattr(Counted, "built", 0)
    monkeypatch.setattr(Counted, "closed", 0)
    registry.register("counted", Counted)


def _sample(i: int = 0) -> FakeSample:
    return FakeSample(prompt="", metadata={"env": "counted"}, index=i)


async def test_one_context_serves_every_call_and_closing_it_closes_the_envs(tiny_checkpoint, tiny_tokenizer, monkeypatch):
    _counted(monkeypatch)
    loads = []
    real_load = edge.load_chat_tokens
    monkeypatch.setattr(edge, "load_chat_tokens", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    async with FakeSGLang(tiny_tokenizer, ["hello"] * 4) as engine:
        args = make_args(tiny_checkpoint, engine.host, engine.port)
        outs = await asyncio.gather(*(edge.generate(args, _sample(i), PARAMS) for i in range(3)))
        assert [await edge.reward(args, out) for out in outs] == [1.0, 1.0, 1.0]
        context = await edge.rollout_context(args)
        session = context.session
        assert (Counted.built, len(loads), Counted.closed) == (1, 1, 0)  # built once, for every call
        await edge.close_context()
    assert Counted.closed == 1 and session.closed
    assert context.envs == {}


async def test_new_args_end_the_old_context(tiny_checkpoint, tiny_tokenizer, monkeypatch):
    _counted(monkeypatch)
    async with FakeSGLang(tiny_tokenizer, ["a", "b"]) as engine:
        await edge.generate(make_args(tiny_checkpoint, engine.host, engine.port), _sample(), PARAMS)
        await edge.generate(make_args(tiny_checkpoint, engine.host, engine.port), _sample(), PARAMS)
        assert (Counted.built, Counted.closed) == (2, 1)
        await edge.close_context()
    assert Counted.closed == 2


def test_at_exit_the_context_is_closed_on_the_loop_slime_runs_it_on(tiny_checkpoint, tiny_tokenizer, monkeypatch):
    """Slime runs every rollout call on one event loop in a daemon thread (slime/utils/async_utils.py) and
    offers no shutdown hook: the interpreter-exit handler closes the context on that loop while it runs."""
    _counted(monkeypatch)
    with background_loop() as slime_loop:

        def run(coro):
            return asyncio.run_coroutine_threadsafe(coro, slime_loop).result(60)

        engine = FakeSGLang(tiny_tokenizer, ["hi"])
        run(engine.__aenter__())
        try:
            args = make_args(tiny_checkpoint, engine.host, engine.port)
            out = run(edge.generate(args, _sample(), PARAMS))
            assert out.response_length > 0 and Counted.closed == 0
            session = run(edge.rollout_context(args)).session
            edge._close_at_exit()  # what atexit runs
            assert Counted.closed == 1 and session.closed
            edge._close_at_exit()  # nothing left: harmless
        finally:
            run(engine.__aexit__(None, None, None))
