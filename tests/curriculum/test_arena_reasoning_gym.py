"""The learnable chain (recipes/curriculum/arena_reasoning_gym.yaml): the candidates' reasoning-gym families that passed
the selection rule (at most four), run at exactly the sizes the selection run measured them at."""

from __future__ import annotations

from pathlib import Path

import pytest

from aclarena_slime.arena.runner import load_arena, stage_overrides
from aclarena_slime.launcher.stage import local_profile
from aclarena_slime.recipes.compose import load_recipe

CURRICULA = Path(__file__).resolve().parents[2] / "recipes" / "curriculum"
CHAIN, CANDIDATES = CURRICULA / "arena_reasoning_gym.yaml", CURRICULA / "arena_reasoning_gym_candidates.yaml"
PAPER_METHODS = {"sequential", "replay", "kl_anchor", "mle", "oracles"}


def test_the_chain_is_candidates_in_their_order_at_the_selection_run_sizes() -> None:
    chain, candidates = load_arena(CHAIN), load_arena(CANDIDATES)
    listed = [(s.name, s.recipe, s.overrides) for s in candidates.stages]
    chosen = [(s.name, s.recipe, s.overrides) for s in chain.stages]
    assert 2 <= len(chosen) <= 4 and all(stage in listed for stage in chosen)
    assert [listed.index(stage) for stage in chosen] == sorted(listed.index(stage) for stage in chosen)
    # every size the selection measured the oracles at is the chain's: a change to one file must reach the other
    assert (chain.base, chain.eval_size, chain.overrides) == (candidates.base, candidates.eval_size, candidates.overrides)
    assert set(chain.methods) == PAPER_METHODS and set(candidates.methods) == {"oracles"}
    assert chain.eval_size >= 128  # effects several prompts wide: one prompt of 128 is 0.8 points
    assert (chain.seed, candidates.seed) == (0, 100)  # the selection's validation prompts: a seed the comparison never runs


def test_each_domain_is_a_variant_of_the_bridge_with_its_own_task() -> None:
    pytest.importorskip("reasoning_gym")
    chain = load_arena(CHAIN, ["output_dir=/nonexistent"])
    tasks = set()
    for stage in chain.stages:
        overrides = [*stage_overrides(chain), *stage.overrides]
        recipe = load_recipe(stage.recipe, overrides, local_profile(overrides, always=True))
        plugin, family = stage.name.split("-", 1)
        assert (plugin, recipe.data.env) == ("reasoning_gym", stage.name)
        settings = recipe.env_config[stage.name]
        assert settings["tasks"] == family and set(settings["task_config"]) == {family}
        assert recipe.cluster.local.warm_start_demos  # the warm start on the generator's answers
        tasks.add(family)
    assert len(tasks) == len(chain.stages)
