"""Every recipe key the local backend does not honour is an error naming it (aclarena_slime.local.spec):
for each recipe group the keys it honours compose, and an injected key it would leave aside is refused."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from aclarena_slime.local.run import local_plan
from aclarena_slime.local.session import open_session
from aclarena_slime.local.spec import EXTRA_KEYS, INERT, RECIPE_KEYS, read_keys
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.recipes.schema import AlgorithmConfig, RolloutConfig

REPO = Path(__file__).resolve().parents[2]
# A stage of each algorithm group (recipes/algorithm/<group>.yaml), as the paper's recipes use them.
GROUP_STAGES = {"grpo": "stage1_math", "gspo": "stage2_search", "sft": "stage2_search_sft", "mopd": "stage1_math"}
STAGES = sorted(p.stem for p in REPO.glob("recipes/*.yaml"))
INJECTED = [
    ("++algorithm.extra.use_dynamic_batch_size=true", "algorithm.extra.use_dynamic_batch_size"),
    ("++extra.rollout_stop_token_ids=[7]", "extra.rollout_stop_token_ids"),
    ("++extra.debug_rollout_only=true", "extra.debug_rollout_only"),
    ("rollout.rollout_max_context_len=4096", "rollout.rollout_max_context_len"),
    ("++algorithm.extra.loss_mask_type=distill_qwen", "algorithm.extra.loss_mask_type"),
]


def compose(stage: str, tmp_path: Path, *overrides: str):
    return load_recipe(REPO / f"recipes/{stage}.yaml", [f"paths.root={tmp_path}", "cluster=local", *overrides])


def test_every_algorithm_group_has_a_stage():
    assert set(GROUP_STAGES) == {p.stem for p in REPO.glob("recipes/algorithm/*.yaml")}


@pytest.mark.parametrize("group", sorted(set(GROUP_STAGES) - {"mopd"}))
def test_a_groups_honoured_keys_compose(group: str, tmp_path: Path):
    """The local profile runs GRPO (its figures' estimator); the command line's GSPO runs too."""
    session = open_session(compose(GROUP_STAGES[group], tmp_path, f"algorithm={group}"))
    assert session.policy.train.loss.estimator == "grpo"
    if group == "gspo":
        gspo = open_session(compose(GROUP_STAGES[group], tmp_path, f"algorithm={group}", "algorithm.advantage_estimator=gspo"))
        assert gspo.policy.train.loss.estimator == "gspo"
        assert "# loss: gspo, the token mean" in local_plan(gspo)  # what --dry-run says


def test_the_mopd_group_is_refused_by_its_distillation_key(tmp_path: Path):
    """On-policy distillation is slime's: its teachers' reverse KL has no local counterpart."""
    with pytest.raises(RecipeError, match=r"algorithm\.extra\.use_opd=True: the local backend does not honour it"):
        open_session(compose("stage1_math", tmp_path, "algorithm=mopd", "algorithm.kl_loss_coef=0.01"))


@pytest.mark.parametrize("group", sorted(set(GROUP_STAGES) - {"mopd"}))
@pytest.mark.parametrize(("override", "named"), INJECTED, ids=[n for _, n in INJECTED])
def test_an_injected_key_the_local_backend_leaves_aside_is_refused_by_name(group, override, named, tmp_path):
    recipe = compose(GROUP_STAGES[group], tmp_path, f"algorithm={group}", override)
    with pytest.raises(RecipeError, match=named.replace(".", r"\.") + "=.*does not honour it"):
        open_session(recipe)


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_recipe_composes_locally_or_is_refused_by_name(stage: str, tmp_path: Path):
    """The paper's recipes and ours: what the local backend runs composes; a rollout-only run (nothing trains)
    and a distillation stage are refused, naming why."""
    recipe = compose(stage, tmp_path)
    if recipe.kind == "mopd":
        with pytest.raises(RecipeError, match="is kind 'mopd'"):
            open_session(recipe)
    elif recipe.extra.get("debug_rollout_only"):
        with pytest.raises(RecipeError, match=r"extra\.debug_rollout_only=True: the local backend does not honour it"):
            open_session(recipe)
    elif recipe.kind == "sft" and recipe.custom.aclarena_sft_filter is None:
        with pytest.raises(RecipeError, match="without a warm-start filter"):
            open_session(recipe)
    else:
        open_session(recipe)


def test_an_sft_loss_on_an_rl_stage_is_refused(tmp_path: Path):
    with pytest.raises(RecipeError, match="loss_type='sft_loss' on a 'rl' stage"):
        open_session(compose("stage1_math", tmp_path, "++algorithm.extra.loss_type=sft_loss"))


def test_every_algorithm_and_rollout_key_is_read_inert_or_refused_unless_default():
    """A new schema field must be classified here: read (RECIPE_KEYS, UNHONOURED), inert (INERT, with why),
    or, as now the context window, refused unless left at its default."""
    fields = {f"algorithm.{f.name}" for f in dataclasses.fields(AlgorithmConfig) if f.name != "extra"}
    fields |= {f"rollout.{f.name}" for f in dataclasses.fields(RolloutConfig)}
    assert set(INERT) <= fields
    assert fields - read_keys() - set(INERT) == {"rollout.rollout_max_context_len"}
    assert all(why for keys in EXTRA_KEYS.values() for _, why in keys.values())


def test_the_allow_list_is_what_the_stages_builder_reads():
    """RECIPE_KEYS (what check_local lets through) names exactly the recipe sections' keys the builder reads
    (aclarena_slime/local/session.py; the optimiser steps a rollout: spec.steps_per_rollout), so a setting read
    without being allowed, or allowed without being read, fails here."""
    source = (REPO / "aclarena_slime" / "local" / "session.py").read_text(encoding="utf-8")
    read = {f"{section}.{name}" for section, name in re.findall(r"\b(algorithm|rollout|data|custom)\.(\w+)", source)}
    read = (read - {"algorithm.extra"}) | {f"algorithm.extra.{k}" for k in re.findall(r'algorithm\.extra\.get\("(\w+)"', source)}
    by_steps_per_rollout = {"rollout.num_steps_per_rollout", "rollout.global_batch_size"}
    sections = ("algorithm.", "rollout.", "data.", "custom.")
    assert read | by_steps_per_rollout == {key for key in RECIPE_KEYS if key.startswith(sections)}
