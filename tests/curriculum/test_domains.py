"""The paper's curricula, mixes and suite, made from one list of domains (recipes/curriculum/domains/paper.yaml).

``paper_today/`` holds the hand-written files as they were before the list: every generated curriculum must
load and compose exactly as its hand-written copy does (names, recipes, starts, experts, overrides, distill
steps, sections, and each stage's composed recipe), the suite must bind the same datasets, the parallel-MLE
mix must compose the same held-out sets.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from aclarena_slime.curriculum.config import load_curriculum
from aclarena_slime.curriculum.runner import stage_recipe
from aclarena_slime.recipes.compiler import load_stage_suite
from aclarena_slime.recipes.compose import load_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
TODAY = Path(__file__).resolve().parent / "paper_today"
PAPER_CURRICULA = ["sequential", "replay", "kl_anchor", "oracles", "mle", "sdft_data", "local_smoke"]


def snapshot(file: Path, folder: Path, tmp: Path, compose: bool = True) -> dict:
    """What a curriculum file runs: its loaded settings, recipe paths resolved as if it lay in ``folder``,
    and (``compose``) each stage's composed recipe."""
    config = load_curriculum(file, [f"output_dir={tmp}"])
    for entry in config.stages:
        entry.recipe = str((folder / entry.recipe).resolve())  # an absolute path stays itself
    if config.monitor.suite:
        config.monitor.suite = str((folder / os.path.relpath(config.monitor.suite, file.parent.resolve())).resolve())
    out = dataclasses.asdict(config)
    out.pop("stages_from", None)  # how the stages were written, not what runs
    if compose:
        out["composed"] = {
            e.name: OmegaConf.to_yaml(OmegaConf.structured(stage_recipe(config, file, e, None))) for e in config.stages
        }
    return out


@pytest.mark.parametrize("name", PAPER_CURRICULA)
def test_each_paper_curriculum_lists_what_its_hand_written_copy_listed(name: str, tmp_path: Path):
    folder = RECIPES / "curriculum"
    new, today = (snapshot(f, folder, tmp_path, compose=False) for f in (folder / f"{name}.yaml", TODAY / f"{name}.yaml"))
    assert new == today


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER_CURRICULA)
def test_each_paper_curriculum_composes_what_its_hand_written_copy_composed(name: str, tmp_path: Path):
    folder = RECIPES / "curriculum"
    assert snapshot(folder / f"{name}.yaml", folder, tmp_path) == snapshot(TODAY / f"{name}.yaml", folder, tmp_path)


def test_the_paper_suite_binds_what_its_hand_written_copy_bound():
    assert load_stage_suite(RECIPES / "eval" / "paper.yaml") == load_stage_suite(TODAY / "eval_paper.yaml")


def test_the_parallel_mle_mix_holds_out_what_its_hand_written_copy_held_out(tmp_path: Path):
    today = OmegaConf.to_container(OmegaConf.load(TODAY / "mle_parallel_mix.yaml").eval_prompt_data)
    recipe = load_recipe(RECIPES / "mle_parallel.yaml", [f"paths.root={tmp_path}"])
    data = recipe.paths.data
    assert recipe.data.eval_prompt_data == {k: v.replace("${paths.data}", data) for k, v in today.items()}
