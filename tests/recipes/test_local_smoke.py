"""Every RL recipe runs two small steps on the local backend: the recipe, its env and the plugins agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aclarena_slime.launcher.stage import main
from aclarena_slime.recipes.compose import load_recipe

REPO = Path(__file__).resolve().parents[2]
TAU3 = REPO.parent / "shared" / "data" / "tau3-retail"
# Every stage recipe is a case; the body skips those that are not one RL expert. Parallel MLE (lora.experts,
# several experts in one run) has its own smoke in tests/local/test_parallel_mle.py; rollout-only runs
# (extra.debug_rollout_only: nothing trains) are slime's, and the local backend refuses them by name. Composing
# every recipe to choose the cases would cost each tier ~9 s of collection.
RECIPES = sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))
# One real local stage per env stays in the fast tier; the other recipes run in the slow one.
PER_ENV = {"stage1_math", "stage2_search", "stage3_retail", "stage4_if"}


def _not_one_rl_expert(name: str) -> str | None:
    """Why the recipe is not a case of this smoke, or None."""
    recipe = load_recipe(str(REPO / f"recipes/{name}.yaml"), ["paths.root=/x"])
    if recipe.kind != "rl":
        return f"a {recipe.kind} recipe"
    if recipe.lora.experts:
        return "parallel MLE (tests/local/test_parallel_mle.py runs it)"
    if recipe.extra.get("debug_rollout_only"):
        return "rollout only: slime's"
    return None


def test_the_experts_and_the_oracles_are_cases():
    assert {"mle_math", "oracle_if"} <= set(RECIPES) and not any(map(_not_one_rl_expert, ("mle_math", "oracle_if")))


@pytest.mark.parametrize("name", [n if n in PER_ENV else pytest.param(n, marks=pytest.mark.slow) for n in RECIPES])
def test_recipe_runs_two_steps_on_the_local_backend(name: str, tmp_path: Path, capsys, test_profile):
    reason = _not_one_rl_expert(name)
    if reason:
        assert name not in PER_ENV, f"{name} is the fast tier's stage of its env, but {reason}"
        pytest.skip(reason)
    overrides = [f"paths.root={tmp_path}", *test_profile]
    if "retail" in name:
        if not TAU3.is_dir():
            pytest.skip(f"τ³-Retail data not found at {TAU3}")
        overrides.append(f"env_config.retail.data_dir={TAU3}")
    assert main([str(REPO / f"recipes/{name}.yaml"), "cluster=local", *overrides]) == 0, capsys.readouterr().err
    metrics = json.loads((tmp_path / "runs" / name / "local" / "metrics.json").read_text())
    assert len(metrics["steps"]) == 2 and metrics["eval_after"]["prompts"] == 1
    # the policy the recipe trains: a LoRA expert (PEFT folder) or, for full fine-tuning, the whole model
    policy = Path(metrics.get("policy_dir") or metrics["adapter_dir"])
    assert policy.parent == tmp_path / "runs" / name / "local"
    assert (policy / ("adapter_config.json" if metrics["expert"] else "config.json")).exists()
