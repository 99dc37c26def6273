"""The template env's stage recipe: a new env borrows it, and its outputs carry the env's name, not the recipe's."""

from __future__ import annotations

from pathlib import Path

from aclarena_slime.local.session import open_session
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "template.yaml"


def test_the_template_recipe_names_its_outputs_after_its_env():
    recipe = load_recipe(RECIPE, ["cluster=local", "paths.root=/r"])
    assert (recipe.name, recipe.run_dir, recipe.data.prompt_data) == ("template", "/r/runs/template", "/r/data/template/train.jsonl")
    session = open_session(recipe)
    assert (str(session.paths.output_dir), session.policy.name) == ("/r/runs/template/local", "template")
    assert session.records.env_config == {"instruction": "Answer with the word only."}


def test_another_env_borrowing_the_recipe_gets_its_own_run_dir_and_expert():
    recipe = load_recipe(RECIPE, ["paths.root=/r", "data.env=mock", "+env_config.mock={max_turns: 2}"])
    assert (recipe.name, recipe.run_dir) == ("mock", "/r/runs/mock")
    lora = compile_recipe(recipe).custom_config["aclarena_lora"]
    assert lora["adapter_name"] == "mock" and lora["sync_dir"].startswith("/r/runs/mock/")
    local = open_session(load_recipe(RECIPE, ["cluster=local", "paths.root=/r", "data.env=mock", "+env_config.mock={}"]))
    assert (str(local.paths.output_dir), local.policy.name) == ("/r/runs/mock/local", "mock")
