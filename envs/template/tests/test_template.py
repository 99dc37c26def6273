import pytest

from aclarena_envs.template.env import TemplateEnvironment
from aclarena_slime.conformance import check_environment, check_hostile_outputs
from aclarena_slime.contract import Task


async def test_template_conforms_and_scores():
    env = TemplateEnvironment({})
    await check_environment(env, [Task(**{**r, "metadata": r["metadata"]}) for r in env.demo_records(2)], turns=["red"])
    episode = await env.start(Task("Say red.", "red", {"env": "template"}))
    await episode.step("<think>easy</think> Red")
    assert (await episode.score()).reward == 1.0


def test_misspelt_config_keys_are_refused():
    assert TemplateEnvironment({"instruction": "One word."}).instruction == "One word."
    with pytest.raises(ValueError, match=r"unknown config keys of the template env \['instructions'\]"):
        TemplateEnvironment({"instructions": "One word."})


async def test_template_survives_hostile_turns():
    env = TemplateEnvironment({})
    await check_hostile_outputs(env, [Task(**r) for r in env.demo_records(1)])
