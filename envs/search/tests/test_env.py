"""The search env's episodes: search then answer, bad turns, the turn limit, config, and the contract kit."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from aclarena_envs.search.demo_corpus import generate, write_jsonl
from aclarena_envs.search.env import SearchEnvironment
from aclarena_slime.plugin.conformance import check_environment, check_hostile_outputs
from aclarena_slime.plugin.contract import Done, Observation, Task

DEMO = generate(60, seed=3)
QUESTION = DEMO.questions[0]


@pytest.fixture
async def env(tmp_path):
    env = SearchEnvironment({"corpus": str(write_jsonl(DEMO.passages, tmp_path / "corpus.jsonl"))})
    yield env
    await env.aclose()


def _task(question=QUESTION):
    return Task(prompt=question.question, label=json.dumps({"target": question.answers}), metadata={"env": "search"})


async def test_search_then_answer(env):
    episode = await env.start(_task())
    [prompt] = episode.conversation.messages
    assert prompt["role"] == "user" and prompt["content"].endswith(f"Question: {QUESTION.question}\n")
    obs = await episode.step(f"<think>look it up</think>\n<search> {QUESTION.question} </search>")
    assert isinstance(obs, Observation) and obs.messages[0]["role"] == "user"
    content = obs.messages[0]["content"]
    assert content.startswith("<information>Doc 1(Title: ") and content.endswith("</information>")
    assert content.count("\nDoc ") == 2 and QUESTION.answers[0] in content  # top-3 by default
    done = await episode.step(f"<think>found it</think>\n<answer> {QUESTION.answers[0].lower()} </answer>")
    assert done == Done("answer")
    score = await episode.score()
    assert score.reward == 1.0
    assert score.breakdown | {"gold": None} == {
        "answer": QUESTION.answers[0].lower(),
        "gold": None,
        "em": 1.0,
        "f1": 1.0,
        "well_formed": True,
        "turns": 2,
        "searches": 1,
        "invalid_turns": 0,
    }
    json.dumps(score.breakdown)


async def test_wrong_answer_and_format_score(tmp_path):
    env = SearchEnvironment({"format_score": 0.2})  # demo corpus: no corpus configured
    clean = await env.start(_task())
    await clean.step("<answer>Nowhere</answer>")
    assert (await clean.score()).reward == pytest.approx(0.2)
    messy = await env.start(_task())
    assert isinstance(await messy.step("I will just talk."), Observation)
    await messy.step(f"<answer>{QUESTION.answers[0]}</answer>")
    score = await messy.score()
    assert score.reward == pytest.approx(0.8) and score.breakdown["invalid_turns"] == 1


async def test_f1_reward():
    env = SearchEnvironment({"reward": "f1"})
    episode = await env.start(Task(prompt="q", label={"target": ["Gorvel river"]}))
    await episode.step("<answer>the Gorvel</answer>")
    score = await episode.score()
    assert score.reward == pytest.approx(2 / 3) and score.breakdown["em"] == 0.0


async def test_the_prompt_example_answer_is_never_scored(env):
    # Search-R1's instruction holds "<answer> Beijing </answer>"; only the model's own turns count.
    episode = await env.start(Task(prompt="q", label={"target": ["Beijing"]}))
    assert "<answer> Beijing </answer>" in episode.conversation.messages[0]["content"]
    await episode.step("<search>q</search>")
    assert (await episode.score()).reward == 0.0


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        ("<search>   </search>", "query was empty"),
        ("<search>" + "word " * 200 + "</search>", "the limit is 512"),
        ("just chatting", "My previous action is invalid"),
    ],
)
async def test_bad_turns_get_an_informative_observation(env, turn, expected):
    episode = await env.start(_task())
    obs = await episode.step(turn)
    assert isinstance(obs, Observation) and expected in obs.messages[0]["content"]
    assert (await episode.score()).breakdown["searches"] == 0


async def test_turn_limit_ends_without_a_wasted_search():
    env = SearchEnvironment({"max_turns": 2})
    assert env.max_turns == 2
    episode = await env.start(_task())
    assert isinstance(await episode.step("<search>a</search>"), Observation)
    assert await episode.step("<search>b</search>") == Done("max_turns")
    score = await episode.score()
    assert score.reward == 0.0 and score.breakdown["searches"] == 1 and not score.breakdown["well_formed"]


async def test_chat_prompts_are_kept_and_stop_strings_are_searchr1s(env):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "full prompt"}]
    episode = await env.start(Task(prompt=messages, label={"target": ["x"]}))
    assert episode.conversation.messages == messages
    assert env.stop == ("</search>", "</answer>") and env.tag == "search"


async def test_demo_fallback_is_announced_once(caplog):
    env = SearchEnvironment({})
    with caplog.at_level(logging.WARNING, logger="aclarena_envs.search.env"):
        for _ in range(2):
            episode = await env.start(_task())
            await episode.step(f"<search>{QUESTION.question}</search>")
    assert sum("demo corpus" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"topk": 0}, "topk"),
        ({"max_turns": "5"}, "max_turns"),
        ({"reward": "bleu"}, "reward"),
        ({"format_score": 2}, "format_score"),
        ({"corpus": "a", "retriever_url": "b"}, "not both"),
        ({"encoder": "m:f"}, "need a corpus"),
        ({"instruction": "no placeholder"}, "{question}"),
        ({"corpuss": "typo"}, "unknown config keys"),
    ],
)
def test_bad_config_is_refused_with_the_key_named(config, message):
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}")):
        SearchEnvironment(config)


async def test_bad_label_is_a_clear_error(env):
    with pytest.raises(ValueError, match="target"):
        await env.start(Task(prompt="q", label={"answer": "x"}))


async def test_conformance_kit(env):
    await check_environment(env, [_task()], turns=[f"<search>{QUESTION.question}</search>", "<answer>x</answer>"])


def test_score_cli_on_a_response():
    out = subprocess.run(
        [sys.executable, "-m", "aclarena_slime", "score", "search", "--label", '{"target": ["Paris"]}'],
        input="<think>I know this.</think>\n<answer> Paris </answer>",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["reward"] == 1.0 and result["ended"] and result["breakdown"]["answer"] == "Paris"


async def test_an_overlong_turn_is_a_notice_and_the_breakdown_keeps_a_short_answer():
    env = SearchEnvironment({"max_turn_chars": 100, "breakdown_answer_chars": 8})
    episode = await env.start(_task())
    obs = await episode.step("<search>" + "x" * 200 + "</search>")
    assert isinstance(obs, Observation) and "the limit is 100" in obs.messages[0]["content"]
    assert await episode.step("<answer>" + "y" * 50 + "</answer>") == Done("answer")
    breakdown = (await episode.score()).breakdown
    assert breakdown["answer"] == "y" * 8
    assert breakdown["invalid_turns"] == 1 and breakdown["searches"] == 0


async def test_survives_hostile_turns(env):
    await check_hostile_outputs(env, [_task()])


@pytest.mark.parametrize("label", [None, {"target": []}, {"answer": "Paris"}, {"target": [None]}, ""])
def test_check_label_refuses_a_label_without_gold_answers(env, label):
    """Offline, with no retriever built: a label with no usable gold answer fails where the data is read."""
    with pytest.raises(ValueError, match="gold answers"):
        env.check_label(label)
    env.check_label({"target": ["Paris", "paris, france"]})
    env.check_label("Paris")
    assert env._retriever is None
