"""The authors' grader (``grader: deepscaler``) beside ours (``math_verify``): the cases where they disagree."""

from __future__ import annotations

from pathlib import Path

import pytest

from aclarena_envs.math import deepscaler
from aclarena_envs.math.env import MathEnvironment
from aclarena_slime.plugin.contract import Task
from aclarena_slime.recipes.compose import load_recipe

RECIPES = Path(__file__).resolve().parents[3] / "recipes"

# (response, gold, ours, the authors')
DISAGREEMENTS = [
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 1.0, 0.0),  # an unreduced fraction is not the reduced one
    ("\\boxed{2+3}", "5", 1.0, 0.0),  # an integer must be written as one
    ("\\boxed{50\\%}", "50", 0.0, 1.0),  # a percent sign is dropped
]
AGREEMENTS = [
    ("\\boxed{073}", "73", 1.0),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),  # sympy decides
    ("\\boxed{x^2}", "x^3", 0.0),
    ("\\boxed{(1,2)}", "(1,3)", 0.0),
    ("\\boxed{12}", "13", 0.0),
]


async def _reward(grader: str, response: str, gold: str) -> float:
    env = MathEnvironment({"workers": 1, "timeout_s": 5.0, "grader": grader})
    try:
        episode = await env.start(Task("Q", gold))
        await episode.step(response)
        return (await episode.score()).reward
    finally:
        await env.aclose()


@pytest.mark.parametrize(("response", "gold", "ours", "authors"), DISAGREEMENTS)
async def test_the_graders_disagree_where_the_authors_grader_is_documented_to(response, gold, ours, authors):
    assert await _reward("math_verify", response, gold) == ours
    assert await _reward("deepscaler", response, gold) == authors


@pytest.mark.parametrize(("response", "gold", "both"), AGREEMENTS)
async def test_the_graders_agree_elsewhere(response, gold, both):
    assert await _reward("deepscaler", response, gold) == both
    assert await _reward("math_verify", response, gold) == both


def test_the_string_rules():
    assert deepscaler.mathd_normalize("x = \\dfrac12") == "\\frac{1}{2}"
    assert deepscaler.mathd_normalize("5 \\text{ cm}") == "5"
    assert deepscaler.mathd_normalize("3/4") == "\\frac{3}{4}"
    assert deepscaler.sympy_normalize("1,000") == "1000"
    assert deepscaler.decide("\\frac{2}{4}", "\\frac{1}{2}") is False  # decided without sympy
    assert deepscaler.decide("2\\sqrt{2}", "\\sqrt{8}") is None  # sympy must decide
    assert deepscaler.decide("x" * 2000, "1") is False


def test_a_tower_of_powers_never_reaches_sympy():
    assert deepscaler.grade_blocking("9^{9^{9^{9}}}", "1") is False


@pytest.mark.parametrize("recipe", ["stage1_math.yaml", "oracle_math.yaml", "mle_math.yaml", "mopd.yaml"])
def test_the_paper_recipes_grade_with_the_authors_rule(recipe, tmp_path):
    loaded = load_recipe(RECIPES / recipe, [f"paths.root={tmp_path}"])
    assert loaded.env_config["math"]["grader"] == "deepscaler"


def test_an_unknown_grader_is_refused():
    with pytest.raises(ValueError, match="grader must be one of"):
        MathEnvironment({"grader": "sympy"})
