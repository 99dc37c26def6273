"""Hostile model output against the math env: nothing a response says may raise out of ``score()`` or
hold the event loop; the worst it can get is a score of 0."""

from __future__ import annotations

import asyncio
import time

import pytest

from aclarena_envs.math.env import MathEnvironment
from aclarena_slime.plugin.contract import Task
from aclarena_slime.slime_edge.rollout import generate, reward
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import FakeSample, check_invariants, make_args

# Python refuses int() on strings of more than 4,300 digits (sys.get_int_max_str_digits)
HUGE_INTEGER = "\\boxed{" + "7" * 4301 + "}"


async def _score(response: str, label: str = "7", **config) -> tuple[float, dict]:
    env = MathEnvironment({"workers": 1, "timeout_s": 3.0, **config})
    try:
        episode = await env.start(Task("Q", label, {"env": "math"}))
        await episode.step(response)
        score = await episode.score()
        return score.reward, score.breakdown
    finally:
        await env.aclose()


async def test_a_huge_integer_scores_zero_instead_of_raising():
    value, breakdown = await _score(HUGE_INTEGER)
    assert value == 0.0 and breakdown["method"] == "too_long"
    # with the length cap lifted, the integer path compares it without int()
    value, breakdown = await _score(HUGE_INTEGER, max_answer_chars=10_000)
    assert value == 0.0 and breakdown["method"] == "integer"
    value, _ = await _score(HUGE_INTEGER, label="7" * 4301, max_answer_chars=10_000)
    assert value == 1.0, "a long integer that is the gold answer is still right"


async def test_a_huge_integer_through_the_rollout_is_scored_not_removed(tiny_checkpoint, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, [HUGE_INTEGER]) as engine:
        args = make_args(tiny_checkpoint, engine.host, engine.port, rollout_max_response_len=8192)
        sample = FakeSample(prompt="What is 3 + 4?", label="7", metadata={"env": "math"})
        out = await generate(args, sample, {"temperature": 1.0, "max_new_tokens": 8192})
    check_invariants(out)
    assert out.status is FakeSample.Status.COMPLETED and not out.remove_sample, out.metadata["aclarena"].get("error")
    assert await reward(args, out) == 0.0


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{9^{9^{9^{9^{9}}}}}",  # a tower: sympy would never finish
        "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",  # deep nesting
        "\\boxed{" + "\\frac{1}{" * 2000 + "2" + "}" * 2000 + "}",
        "\\boxed{1" + "0" * 100_000 + "/3}",
        "\\boxed{" + "1+" * 300_000 + "1}",  # a 600 kB answer
        "x" * 1_000_000 + "\\boxed{7}",  # 1 MB of reasoning, a fine answer
        "\\boxed{10^{10^{10}}}",
        "\\boxed{" + "9" * 5000 + "." + "9" * 5000 + "}",
        "\\boxed{\\sqrt{" + "9" * 5000 + "}}",
        "\\boxed{(" + "1," * 100_000 + "1)}",
    ],
)
async def test_hostile_answers_score_without_raising_or_stalling(response):
    env = MathEnvironment({"workers": 1, "timeout_s": 3.0})
    episode = await env.start(Task("Q", "7", {"env": "math"}))
    await episode.step(response)
    loop = asyncio.get_running_loop()
    longest = 0.0
    last = loop.time()
    stop = False

    async def heartbeat() -> None:
        nonlocal longest, last
        while not stop:
            await asyncio.sleep(0.005)
            now = loop.time()
            longest, last = max(longest, now - last), now

    beat = asyncio.create_task(heartbeat())
    start = time.monotonic()
    try:
        score = await episode.score()
    finally:
        stop = True
        await beat
        await env.aclose()
    assert score.reward in (0.0, 1.0)
    assert score.reward == (1.0 if response.endswith("\\boxed{7}") else 0.0)
    assert time.monotonic() - start < 3.0 + 10.0, "bounded by the verifier's hard timeout"
    assert longest < 1.0, f"the event loop was held for {longest:.2f}s"


async def test_the_hostile_output_kit_passes_on_math():
    """The shared kit (known-bad corpus plus generated turns) that every env runs."""
    from aclarena_slime.plugin.conformance import check_hostile_outputs

    env = MathEnvironment({"workers": 1, "timeout_s": 3.0})
    try:
        await check_hostile_outputs(env, [Task(**r) for r in env.demo_records(2)])
    finally:
        await env.aclose()
