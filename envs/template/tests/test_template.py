"""The template env: it keeps the contract (the conformance kit, its tag's entry point included), scores,
refuses misspelt settings, and its data module writes what ``aclarena data prepare template`` promises."""

from __future__ import annotations

import json

import pytest

from aclarena_envs.template import data
from aclarena_envs.template.env import TemplateEnvironment
from aclarena_slime.plugin.conformance import check_environment, check_hostile_outputs
from aclarena_slime.plugin.contract import Task


def tasks(n: int) -> list[Task]:
    return [Task(**record) for record in data.demo_records(n)]


async def test_template_conforms():
    env = TemplateEnvironment({})
    await check_environment(env, tasks(2), turns=[data.demo_records(1)[0]["label"]])


async def test_template_survives_hostile_turns():
    await check_hostile_outputs(TemplateEnvironment({}), tasks(1))


async def test_the_gold_turn_scores_one_and_another_word_zero():
    env = TemplateEnvironment({})
    record = data.demo_records(1, seed=3)[0]
    for turn, reward in ((f"<think>easy</think> {data.demo_turns(record)[0].upper()}", 1.0), ("something", 0.0)):
        episode = await env.start(Task(**record))
        await episode.step(turn)
        assert (await episode.score()).reward == reward


def test_misspelt_config_keys_are_refused():
    assert TemplateEnvironment({"instruction": "One word."}).instruction == "One word."
    with pytest.raises(ValueError, match=r"unknown config keys of the template env \['instructions'\]"):
        TemplateEnvironment({"instructions": "One word."})


def test_demo_records_are_many_distinct_and_reproducible(tmp_path):
    records = data.demo_records(200, seed=0)
    assert records == data.demo_records(200, seed=0)
    assert len({r["prompt"] for r in records}) > 150  # a held-out evaluation set can avoid training prompts
    assert all(r["metadata"]["env"] == TemplateEnvironment.tag for r in records)
    out = tmp_path / "train.jsonl"
    assert data.main(["--output", str(out), "--n", "5"]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == data.demo_records(5)
