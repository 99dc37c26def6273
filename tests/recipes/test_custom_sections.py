"""The recipe's ``custom:`` settings are typed sections: a misspelt key fails when the recipe is composed."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest
import yaml

from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import RecipeError, load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _compile(name: str, tmp: Path, *overrides: str):
    return compile_recipe(load_recipe(RECIPES / f"{name}.yaml", [f"paths.root={tmp}", *overrides]))


@pytest.mark.parametrize(
    "override, key",
    [
        ("+custom.aclarena_mopd_teacher_temprature=0.5", "aclarena_mopd_teacher_temprature"),
        ("+custom.aclarena_mopd.teacher_temprature=0.5", "teacher_temprature"),
        ("+custom.aclarena_filters.max_no_tool=0.5", "max_no_tool"),
        ("+custom.aclarena_tis.capp=3", "capp"),
    ],
)
def test_a_misspelt_custom_key_fails_naming_it(tmp_path: Path, override: str, key: str):
    with pytest.raises(RecipeError, match=key):
        _compile("mopd", tmp_path, override)


def test_a_bad_custom_value_fails_at_compile_time(tmp_path: Path):
    # the section's own check, raised when the recipe is composed (as checkpoint.ckpt_step's is)
    with pytest.raises(ValueError, match="aclarena_response_budget"):
        _compile("stage2_search", tmp_path, "custom.aclarena_response_budget=per_episode")
    with pytest.raises(ValueError, match="max_no_tool_fraction"):
        _compile("stage2_search", tmp_path, "+custom.aclarena_filters.max_no_tool_fraction=2")


@pytest.mark.parametrize(
    "override, words",
    [
        ("custom.aclarena_sft_filter.statuses=[complete]", "statuses"),
        ("custom.aclarena_sft_filter.max_tokens=0", "max_tokens"),
    ],
)
def test_a_bad_sft_filter_fails_when_the_recipe_composes(tmp_path: Path, override: str, words: str):
    """The warm start's filter is checked where it is declared, as the SFT data pipeline checks it, not first
    when a stage reaches its SFT phase."""
    with pytest.raises(RecipeError, match=f"aclarena_sft_filter.*{words}"):
        load_recipe(RECIPES / "stage2_search_sft.yaml", [f"paths.root={tmp_path}", override])


def test_the_sft_filter_is_the_sft_pipelines_settings(tmp_path: Path):
    from aclarena_slime.distill.sdft import MixtureSettings

    recipe = load_recipe(RECIPES / "stage2_search_sft.yaml", [f"paths.root={tmp_path}"])
    own = recipe.custom.aclarena_sft_filter
    assert own.mixture() == MixtureSettings(default_threshold=own.min_reward, statuses=tuple(own.statuses))


def test_each_section_reaches_its_hook_through_one_typed_reader(tmp_path: Path):
    """Compiled custom config -> slime's ``args`` (``--custom-config-path`` sets one attribute per key) -> reader."""
    from aclarena_slime.slime_edge import custom

    command = _compile(
        "mopd",
        tmp_path,
        "+custom.aclarena_mopd.teacher_temperature=0.5",
        "+custom.aclarena_filters.max_no_tool_fraction=0.5",
        "+custom.aclarena_tis.cap=3.0",
    )
    args = Namespace(**yaml.safe_load(yaml.safe_dump(command.custom_config)))
    assert custom.mopd(args).teacher_temperature == 0.5
    assert custom.mopd(args).teachers["math"] == "http://127.0.0.1:31001"
    assert custom.filters(args).max_no_tool_fraction == 0.5
    assert custom.tis(args).cap == 3.0
    assert custom.response_budget(args) == "per_turn"
    unset = Namespace()
    assert custom.filters(unset).max_no_tool_fraction == 0.3  # the authors' default
    assert custom.response_budget(unset) == "total"
    assert custom.replay(unset) is None


def test_a_reader_refuses_a_misspelt_key_set_on_args_by_hand():
    from aclarena_slime.slime_edge import custom

    with pytest.raises(ValueError, match="teacher_temprature"):
        custom.mopd(Namespace(aclarena_mopd={"teacher_temprature": 0.5, "teachers": {"math": "http://x:1"}}))


def test_the_engine_patience_is_a_recipe_setting_that_reaches_the_rollout(tmp_path: Path):
    from aclarena_slime.slime_edge.rollout import build_context

    command = _compile("stage2_search", tmp_path, "+custom.aclarena_engine.attempts=5",
                       "+custom.aclarena_engine.read_timeout_s=120")  # fmt: skip
    section = command.custom_config["aclarena_engine"]
    assert section["attempts"] == 5 and section["read_timeout_s"] == 120
    args = Namespace(sglang_router_ip="127.0.0.1", sglang_router_port=1, hf_checkpoint=str(tmp_path),
                     rollout_max_response_len=64, aclarena_engine=section)  # fmt: skip
    retry = build_context(args).retry
    assert (retry.attempts, retry.read_timeout_s) == (5, 120)
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        _compile("stage2_search", tmp_path, "+custom.aclarena_engine.attempts=0")
