"""The env end to end: labels, reward levels and modes, thinking, the score CLI, offline operation."""

from __future__ import annotations

import io
import json
import socket

import pytest

from aclarena_envs.ifeval.checkers import INSTRUCTIONS, LabelError
from aclarena_envs.ifeval.env import IFEvalEnvironment
from aclarena_envs.ifeval.generator import generate
from aclarena_envs.ifeval.metrics import aggregate
from aclarena_envs.ifeval.reward import Label, judge, loose_variants, strip_thinking
from aclarena_slime.plugin.conformance import check_environment, check_hostile_outputs
from aclarena_slime.plugin.contract import Task

LABEL = {
    "instruction_id_list": ["punctuation:no_comma", "detectable_format:title"],
    "kwargs": [{}, {}],
}


async def _score(response: str, config: dict | None = None, label: object = None) -> tuple[float, dict]:
    env = IFEvalEnvironment(config or {})
    episode = await env.start(Task(prompt="Write.", label=json.dumps(label or LABEL), metadata={"env": "ifeval"}))
    await episode.step(response)
    score = await episode.score()
    json.dumps(score.breakdown)  # the breakdown must be JSON-serialisable
    return score.reward, score.breakdown


async def test_prompt_level_is_all_or_nothing() -> None:
    assert (await _score("<<Title>>\nNo commas."))[0] == 1.0
    reward, breakdown = await _score("<<Title>>\nOne, two.")
    assert reward == 0.0
    assert breakdown["instruction_strict"] == 0.5
    assert [item["strict"] for item in breakdown["instructions"]] == [False, True]


async def test_instruction_level_gives_the_fraction() -> None:
    assert (await _score("<<Title>>\nOne, two.", {"level": "instruction"}))[0] == 0.5


async def test_loose_mode_forgives_a_chatty_first_line() -> None:
    response = "Sure, here you go:\n<<Title>>\nNo commas."
    assert (await _score(response))[0] == 0.0
    reward, breakdown = await _score(response, {"mode": "loose"})
    assert reward == 1.0 and breakdown["prompt_loose"] and not breakdown["prompt_strict"]


async def test_thinking_is_not_scored() -> None:
    reward, breakdown = await _score("<think>Hmm, commas, commas.</think>\n\n<<Title>>\nNo commas.")
    assert reward == 1.0 and breakdown["thinking_removed"]
    assert (await _score("<<Title>> <think>never, closed"))[0] == 1.0
    assert (await _score("<think>only thinking, no answer"))[0] == 0.0


def test_strip_thinking_keeps_plain_responses_byte_for_byte() -> None:
    assert strip_thinking("  spaced\n") == ("  spaced\n", False)
    assert strip_thinking("<think>a</think>\n\nanswer\n") == ("answer", True)


def test_loose_variants_are_iFEvals_eight() -> None:
    variants = loose_variants("*first*\nmiddle\n*last*")
    assert variants == ["*first*\nmiddle\n*last*", "first\nmiddle\nlast", "middle\n*last*", "*first*\nmiddle",
                        "middle", "middle\nlast", "first\nmiddle", "middle"]  # fmt: skip


@pytest.mark.parametrize(
    "label",
    [
        "not json",
        {"instruction_id_list": []},
        {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]},
        {"instruction_id_list": ["punctuation:unknown"], "kwargs": [{}]},
        {"instruction_id_list": ["keywords:existence"], "kwargs": [{}]},
    ],
)
async def test_bad_labels_fail_at_start(label: object) -> None:
    env = IFEvalEnvironment({})
    raw = label if isinstance(label, str) else json.dumps(label)
    with pytest.raises(LabelError):
        await env.start(Task(prompt="x", label=raw))


def test_bad_config_is_an_error() -> None:
    with pytest.raises(ValueError, match="level"):
        IFEvalEnvironment({"level": "token"})
    with pytest.raises(ValueError, match="unknown config"):
        IFEvalEnvironment({"strictness": "loose"})


async def test_conforms_to_the_contract() -> None:
    env = IFEvalEnvironment({})
    tasks = [Task(prompt=r["prompt"], label=r["label"], metadata=r["metadata"]) for r in env.demo_records(3, seed=5)]
    await check_environment(env, tasks)


def test_score_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from aclarena_slime.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO("<<A Title>>\nNo commas at all."))
    assert main(["score", "ifeval", "--label", json.dumps(LABEL)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reward"] == 1.0 and len(out["breakdown"]["instructions"]) == 2


def test_metrics_give_ifevals_four_numbers() -> None:
    label = Label.parse(LABEL)
    breakdowns = [judge(label, r).breakdown() for r in ("<<T>>\nok", "<<T>>\na, b\nc, d", "Sure, fine:\n<<T>>\nok")]
    metrics = aggregate(breakdowns)
    assert metrics.prompts == 3 and metrics.instructions == 6
    assert metrics.prompt_strict == pytest.approx(1 / 3)
    assert metrics.instruction_strict == pytest.approx(4 / 6)
    assert metrics.prompt_loose == pytest.approx(2 / 3)
    assert metrics.instruction_loose == pytest.approx(5 / 6)
    assert metrics.per_instruction["detectable_format:title"] == (1.0, 1.0, 3)
    with pytest.raises(ValueError):
        aggregate([])


def test_nothing_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every checker runs (sentence splitting, word tokens, language detection) with sockets refused."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    seen: set[str] = set()
    for prompt in generate(200, seed=11, max_instructions=4):
        verdicts = judge(prompt.label, "Dr. Smith wrote this. It has, SOME words.\n\n*Highlight* here.\n***\nEnd.")
        seen.update(verdicts.instruction_ids)
    assert seen == set(INSTRUCTIONS)


async def test_survives_hostile_turns() -> None:
    env = IFEvalEnvironment({})
    try:
        await check_hostile_outputs(env, [Task(**r) for r in env.demo_records(2)])
    finally:
        await env.aclose()


@pytest.mark.parametrize(
    "label, says",
    [
        ({"instruction_id_list": ["no:such_instruction"], "kwargs": [{}]}, "no:such_instruction"),
        ({"instruction_id_list": ["punctuation:no_comma"], "kwargs": []}, "one object per instruction"),
        ("not a label", "label is not JSON"),
        (["punctuation:no_comma"], "label must be an object"),
    ],
)
def test_check_label_refuses_what_start_would_refuse(label, says):
    """The data readers (an evaluation's datasets, the doctor) call check_label offline: it refuses a label the
    episode could not score, naming why, and accepts a good one."""
    env = IFEvalEnvironment({})
    with pytest.raises(ValueError, match=says):
        env.check_label(label)
    env.check_label(LABEL)
