"""The exact fast path against math-verify: it decides only what it can decide exactly, and it agrees
with math-verify on the benchmark's fixed answer set."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from math_verify import parse as mv_parse
from math_verify import verify as mv_verify

from aclarena_envs.math.env import MathEnvironment
from aclarena_envs.math.exact import compare, decide, parse
from aclarena_envs.math.lane import Lane
from aclarena_slime.plugin.contract import Task

ANSWER_SET = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_math_verify.jsonl"


def math_verify_says(gold: str, pred: str) -> bool:
    """math-verify as the env's workers call it (gold as ``$gold$``, the prediction boxed)."""
    return bool(mv_verify(mv_parse(f"${gold}$"), mv_parse(f"\\boxed{{{pred}}}")))


@pytest.mark.parametrize(
    ("gold", "pred", "expected"),
    [
        ("73", "073", True),
        ("7" * 5000, "0" + "7" * 5000, True),  # no int(): any length
        ("1000", "1{,}000", True),
        ("1000", "1\\,000", None),  # math-verify reads 1\,000 as a product: not ours to decide
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{1}{3}", "0.333333", True),  # math-verify rounds to 6 places
        ("\\frac{1}{3}", "0.3333333", None),  # more places than that: its own rules
        ("\\frac{1}{3}", "0.333", False),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("\\frac{\\sqrt{6}}{3}", "\\sqrt{\\frac{2}{3}}", True),
        ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt2}{2}", True),
        ("1/2", "\\frac12", True),
        ("\\frac{7\\pi}{5}", "\\frac{7}{5}\\pi", True),
        ("(1,2)", "\\left(1, 2\\right)", True),
        ("(1,2)", "(2,1)", False),
        ("(1,2)", "[1,2]", False),
        ("[2,1]", "[3,1]", None),  # both the empty set to math-verify
        ("(0,\\infty)", "(0,\\infty]", True),  # open at infinity either way
        ("x^2", "x^2", None),
        ("3", "\\text{3}", None),
    ],
)
def test_decisions(gold, pred, expected):
    assert compare(gold, pred) is expected


def test_hostile_answers_are_left_undecided_quickly():
    for text in ["9" * 100 + "/7", "\\sqrt{" + "9" * 30 + "}", "{" * 5000 + "1" + "}" * 5000, "1+" * 10_000 + "1"]:
        assert parse(text) is None
    assert decide("7", "7" * 4301) == (False, "integer")


def test_agrees_with_math_verify_on_the_fixed_set():
    records = [json.loads(line) for line in ANSWER_SET.read_text().splitlines() if line.strip()]
    assert len(records) >= 300 and {r["kind"] for r in records} >= {"aime", "fraction", "root", "tuple", "interval"}
    reference = [math_verify_says(r["gold"], r["pred"]) for r in records]
    assert 0.2 * len(records) < reference.count(False) < 0.5 * len(records), "the set is a mix of right and wrong"
    decided = [(compare(r["gold"], r["pred"]), ref) for r, ref in zip(records, reference, strict=True)]
    # what the env does: the fast path's verdict, or math-verify's where it has none
    env_agrees = sum((ref if ours is None else ours) == ref for ours, ref in decided)
    assert env_agrees >= math.ceil(0.99 * len(records))
    assert sum(ours is not None for ours, _ in decided) >= 0.9 * len(records), "the fast path decides most answers"


_digits = st.integers(0, 40).map(str)
_decimal = st.builds(
    lambda a, b: f"{a}.{b}",
    st.integers(0, 20),
    st.sampled_from(["5", "25", "333333", "3333333", "75", "0", "666667", "414214", "707107"]),
)
_number = st.one_of(_digits, _decimal, st.integers(0, 999).map(lambda n: f"{n:03d}"))


@st.composite
def _scalar(draw, depth: int = 0):
    inner = _number if depth >= 1 else _scalar(depth + 1)
    form = draw(st.integers(0, 9))
    a, b = draw(_number), draw(inner)
    text = [
        a,
        f"\\frac{{{b}}}{{{a}}}",
        f"{draw(st.sampled_from(['', a]))}\\sqrt{{{b}}}",
        f"\\frac{draw(st.integers(1, 9))}{draw(st.integers(1, 9))}",
        f"{a}/{b}",
        f"{a}+\\sqrt{{{draw(_digits)}}}",
        f"{draw(st.sampled_from(['', a]))}\\pi",
        f"({b})",
        f"{a}-{b}",
        f"\\dfrac{{{a}}}{{\\sqrt{{{draw(_digits)}}}}}",
    ][form]
    return draw(st.sampled_from(["", "", "-", "+"])) + text if depth == 0 else text


@st.composite
def _answer(draw):
    if draw(st.booleans()):
        return draw(_scalar())
    items = draw(st.lists(_scalar(), min_size=2, max_size=3))
    if len(items) == 2 and draw(st.booleans()):
        items[draw(st.integers(0, 1))] = draw(st.sampled_from(["-\\infty", "\\infty", "+\\infty"]))
    return draw(st.sampled_from("([")) + ",".join(items) + draw(st.sampled_from(")]"))


@st.composite
def _pair(draw):
    gold = draw(_answer())
    kind = draw(st.integers(0, 2))
    pred = gold if kind == 0 else draw(_answer()) if kind == 1 else gold.replace("1", "2", 1).replace(")", "]", 1)
    return gold, pred


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pair())
def test_an_exact_equal_is_an_equal_to_math_verify(pair):
    gold, pred = pair
    if compare(gold, pred) is True:
        assert math_verify_says(gold, pred), (gold, pred)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pair())
def test_an_exact_different_is_different_to_math_verify(pair):
    gold, pred = pair
    if compare(gold, pred) is False:
        assert not math_verify_says(gold, pred), (gold, pred)


@given(st.text(max_size=300))
def test_any_text_is_decided_or_left_without_raising(text):
    assert compare("\\frac{1}{2}", text) in (True, False, None)
    assert compare(text, "7") in (True, False, None)


async def test_the_lane_runs_every_job_once_and_yields_between_slices():
    lane = Lane(slice_s=0.0)  # every job in a turn of its own
    ran: list[int] = []
    turns = 0

    async def count_turns() -> None:
        nonlocal turns
        for _ in range(50):
            await asyncio.sleep(0)
            turns += 1

    counter = asyncio.create_task(count_turns())
    results = await asyncio.gather(*(lane.run(lambda i=i: ran.append(i) or i * i) for i in range(20)))
    await counter
    assert results == [i * i for i in range(20)] and ran == list(range(20))
    assert turns >= 19, "other tasks ran between the jobs"
    with pytest.raises(ZeroDivisionError):
        await lane.run(lambda: 1 / 0)
    assert await lane.run(lambda: "still works") == "still works"


async def test_a_gathered_batch_is_scored_like_one_at_a_time():
    env = MathEnvironment({"workers": 1, "timeout_s": 3.0})
    records = [json.loads(line) for line in ANSWER_SET.read_text().splitlines()[:60]]
    episodes = []
    for r in records:
        episode = await env.start(Task("Q", r["gold"], {"env": "math"}))
        await episode.step(f"\\boxed{{{r['pred']}}}")
        episodes.append(episode)
    try:
        gathered = [s.reward for s in await asyncio.gather(*(e.score() for e in episodes))]
        one_by_one = [(await e.score()).reward for e in episodes]
    finally:
        await env.aclose()
    assert gathered == one_by_one and 0 < sum(gathered) < len(gathered)


def test_a_decreasing_pair_with_an_infinite_end_is_left_to_math_verify():
    # math-verify reads both as the same empty set; the brackets were rewritten before the tuple rule applied
    gold, pred = "(1,-\\infty]", "(2,-\\infty]"
    assert compare(gold, pred) is None
    assert math_verify_says(gold, pred)
