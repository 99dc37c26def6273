"""The authors check the raw response (``thinking: keep``), we strip the thinking (``strip``): both verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from aclarena_envs.ifeval.env import IFEvalEnvironment
from aclarena_slime.plugin.contract import Task
from aclarena_slime.recipes.compose import load_recipe

LABEL = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
RESPONSE = "<think>Let me think, carefully.</think>A short answer with no commas at all."


async def _reward(config: dict) -> float:
    env = IFEvalEnvironment(config)
    try:
        episode = await env.start(Task("Answer without commas.", LABEL))
        await episode.step(RESPONSE)
        return (await episode.score()).reward
    finally:
        await env.aclose()


async def test_a_comma_in_the_thinking_fails_only_the_raw_check():
    assert await _reward({}) == 1.0  # ours: the thinking is removed first
    assert await _reward({"thinking": "keep"}) == 0.0  # the authors': the raw response has a comma


def test_the_paper_recipe_checks_the_raw_response(tmp_path):
    recipe = load_recipe(Path(__file__).resolve().parents[3] / "recipes" / "stage4_if.yaml", [f"paths.root={tmp_path}"])
    assert recipe.env_config["ifeval"]["thinking"] == "keep"


def test_an_unknown_thinking_rule_is_refused():
    with pytest.raises(ValueError, match="thinking must be one of"):
        IFEvalEnvironment({"thinking": "drop"})
