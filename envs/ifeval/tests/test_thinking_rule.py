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


async def test_a_long_answer_with_thinking_scores_under_the_paper_settings():
    """30,000 characters, thinking included, that follow the instruction: 1.0 under stage 4's IF settings (no cap,
    the authors' rule); the default 20,000-character cap would score it 0."""
    from aclarena_slime.recipes.compiler import read_stage

    thinking = "<think>" + "I plan the answer step by step. " * 940 + "</think>"
    response = thinking + "Here is my answer without any commas at all."
    assert len(response) > 30_000 and "," not in response
    label = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    rewards = {}
    for name, config in (("paper", read_stage("stage4_if", "ifeval").env_config), ("capped", {"thinking": "keep"})):
        env = IFEvalEnvironment(config)
        try:
            episode = await env.start(Task("Answer without commas.", label))
            await episode.step(response)
            rewards[name] = (await episode.score()).reward
        finally:
            await env.aclose()
    assert rewards == {"paper": 1.0, "capped": 0.0}
