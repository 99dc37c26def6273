"""The LLM user simulator against a real HTTP server speaking OpenAI's chat protocol, and its failures."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from aclarena_envs.retail.user_sim import (
    GUIDELINES,
    LLMUser,
    ScriptedUser,
    build_user_simulator,
    scenario_text,
    stop_reason,
)
from aclarena_slime.http_service import serving
from aclarena_slime.plugin.contract import EpisodeAborted


class FakeChatServer:
    """``POST /v1/chat/completions`` answering from a script of (status, body) or callables."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.requests: list[dict] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"body": await request.json(), "auth": request.headers.get("Authorization")})
        answer = self.answers.pop(0)
        if callable(answer):
            return await answer()
        status, body = answer
        if isinstance(body, str):
            return web.Response(status=status, text=body)
        return web.json_response(body, status=status)


def chat(text):
    return (
        200,
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]},
    )


async def test_session_plays_the_customer_side(monkeypatch):
    monkeypatch.setenv("SIM_KEY", "secret")
    server = FakeChatServer([chat("<think>I am Ann.</think>Hi, I want to cancel an order."), chat("Yes. ###STOP###")])
    async with serving(server.app()) as url:
        sim = build_user_simulator(
            {"kind": "llm", "base_url": f"{url}/v1", "model": "user-model", "api_key_env": "SIM_KEY", "max_tokens": 64}
        )
        session = sim.session("Reason for call:\n    cancel #W1")
        first = await session.reply("Hi! How can I help you today?")
        second = await session.reply("Shall I cancel #W1?")
        await sim.aclose()
    assert first == "Hi, I want to cancel an order."
    assert stop_reason(second) == "user_stop"
    body = server.requests[1]["body"]
    assert server.requests[0]["auth"] == "Bearer secret"
    assert body["model"] == "user-model" and body["temperature"] == 0.0 and body["max_tokens"] == 64
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "user"]  # the agent speaks as "user" to the simulator
    assert body["messages"][0]["content"].startswith(GUIDELINES) and "cancel #W1" in body["messages"][0]["content"]
    assert body["messages"][2]["content"] == first  # thinking is not kept in the history


async def test_server_errors_are_retried_then_succeed():
    server = FakeChatServer([(503, "overloaded"), chat("Hello.")])
    async with serving(server.app()) as url:
        sim = LLMUser(f"{url}/v1", "m", retries=1, backoff_s=0.01)
        assert await sim.session("s").reply("hi") == "Hello."
        await sim.aclose()
    assert len(server.requests) == 2


async def _slow():
    await asyncio.sleep(1)
    return web.json_response({})


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ([(400, "bad request")], "refused the request: HTTP 400"),
        ([(500, "boom"), (502, "boom")], "failed after 2 attempts: HTTP 502"),
        ([(200, {"choices": []})], "without a message"),
        ([(200, "not json at all"), (200, "still not")], "failed after 2 attempts"),
        ([chat(None)], "without text"),
        ([chat("<think>only thinking</think>   ")], "empty text"),
        ([_slow, _slow], "TimeoutError"),
    ],
)
async def test_simulator_failures_abort_the_episode(answers, message):
    server = FakeChatServer(answers)
    async with serving(server.app()) as url:
        sim = LLMUser(f"{url}/v1", "m", retries=len(answers) - 1, timeout_s=0.3, backoff_s=0.01)
        with pytest.raises(EpisodeAborted, match=message):
            await sim.session("s").reply("hi")
        await sim.aclose()


async def test_unreachable_simulator_aborts():
    async with serving(web.Application()) as url:
        dead = url  # the port is released when the block ends
    sim = LLMUser(f"{dead}/v1", "m", retries=0)
    with pytest.raises(EpisodeAborted, match="failed after 1 attempts"):
        await sim.session("s").reply("hi")
    await sim.aclose()


def test_config_errors_are_clear(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_KEY_VAR"):
        build_user_simulator({"base_url": "http://x/v1", "model": "m", "api_key_env": "NO_SUCH_KEY_VAR"})
    with pytest.raises(ValueError, match="unknown user simulator settings"):
        build_user_simulator({"base_url": "http://x/v1", "model": "m", "temprature": 0})
    with pytest.raises(ValueError, match="kind"):
        build_user_simulator({"kind": "human"})
    with pytest.raises(ValueError, match="base_url and model"):
        build_user_simulator({})
    for key, bad in (("retries", "2"), ("temperature", True), ("max_tokens", 0), ("extra_body", ["x"])):
        with pytest.raises(ValueError, match=f"setting {key} has a bad value"):
            build_user_simulator({"base_url": "http://x/v1", "model": "m", key: bad})


def test_every_constructor_setting_is_a_config_key():
    sim = build_user_simulator({"kind": "llm", "base_url": "http://x/v1", "model": "m", "think_end": "</reasoning>"})
    assert isinstance(sim, LLMUser) and sim.think_end == "</reasoning>"
    assert sim._text(chat("<reasoning>hm</reasoning> Hello.")[1]) == "Hello."


async def test_scripted_user_then_stop():
    session = ScriptedUser(["hello", "yes"]).session("s")
    assert [await session.reply(t) for t in ("a", "b", "c")] == ["hello", "yes", "###STOP###"]
    assert session.heard == ["a", "b", "c"]


def test_scenario_text_and_stop_markers():
    text = scenario_text(
        {
            "persona": "Terse.",
            "instructions": {"reason_for_call": "Cancel #W1.", "known_info": None, "task_instructions": "Be brief."},
        }
    )
    assert text.splitlines() == [
        "Persona:",
        "    Terse.",
        "Reason for call:",
        "    Cancel #W1.",
        "Task instructions:",
        "    Be brief.",
    ]
    assert stop_reason("ok ###TRANSFER###") == "user_transfer"
    assert stop_reason("###OUT-OF-SCOPE###") == "user_out_of_scope"
    assert stop_reason("thanks, bye") is None


def test_an_env_client_lives_on_one_event_loop():
    """A second loop is a clear error, not a session silently replaced (aiohttp binds a session to its loop)."""
    sim = LLMUser("http://127.0.0.1:9/v1", "m", retries=0)  # nothing listens: each call fails after making its session

    async def call() -> None:
        with pytest.raises(EpisodeAborted):
            await sim.session("s").reply("hi")

    async def first_loop() -> None:
        await call()
        await call()  # the same loop reuses the session
        await sim.aclose()  # closed on the loop that made it

    asyncio.run(first_loop())
    asyncio.run(call())  # after aclose a new loop may start afresh

    with pytest.raises(RuntimeError, match="one loop"):
        asyncio.run(call())  # the session of the previous loop is still open: refused, named
    asyncio.run(sim.aclose())
