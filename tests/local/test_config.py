"""The local stage's builder (aclarena_slime.local.session.open_session) over a stage recipe: its derived paths and
parts, and every bad setting refused naming it (a check the schema makes fails when the recipe composes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.testing.local import LEARNABLE, local_recipe, local_session


def test_defaults_and_derived_paths(tmp_path):
    session = local_session(tmp_path, *LEARNABLE, "data.env=search")
    out = tmp_path / "runs" / "stage1_math" / "local"
    assert session.policy.name == "search"
    assert session.paths.adapter_dir == out / "adapter"
    assert session.paths.metrics_path == out / "metrics.json"
    assert session.model.source == "tiny"
    chained = local_session(tmp_path, *LEARNABLE, "++cluster.local.backbone=/b", "++cluster.local.model=/m")
    assert chained.model.source == "/b"


def test_megatron_target_names_become_peft_names(tmp_path):
    session = local_session(tmp_path, *LEARNABLE, "data.env=math", "lora.target_modules=[linear_qkv,linear_fc1,o_proj]")
    lora = session.policy.lora
    assert lora.hf_target_modules() == ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "o_proj"]
    assert (lora.rank, lora.alpha, session.policy.name) == (8, 16.0, "math")
    with pytest.raises(ValueError, match="lm_heads"):
        local_session(tmp_path, *LEARNABLE, "lora.target_modules=[lm_heads]")


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("rollout.num_rollout=0", "num_rollout"),
        ("rollout.n_samples_per_prompt=1.5", "n_samples_per_prompt"),
        ("algorithm.lr=0.0", "lr must be positive"),
        ("rollout.rollout_temperature=0.0", "temperature must be positive"),
        ("data.eval_temperature=-1.0", "eval_temperature must be >= 0"),
        ("data.eval_top_p=1.5", r"eval_top_p must be in \(0, 1\]"),
        ("data.eval_max_response_len=0", "eval_max_response_len must be positive"),
        ("data.n_samples_per_eval_prompt=-1", "eval_samples must be a positive integer"),
        ("algorithm.eps_clip_high=-0.1", "clip eps must be non-negative"),
        ("algorithm.adam_beta2=1.0", r"AdamW needs weight_decay >= 0 and betas in \[0, 1\)"),
        ("algorithm.kl_loss_type=k9", "kl_loss_type must be one of"),
        ("++cluster.local.top_p=1.5", "top_p"),
        ("lora.dropout=1.0", "dropout"),
        ("lora.target_modules=[]", "target_modules"),
        ("++lora.rnak=4", "rnak"),
        ("++cluster.local.engine_port=70000", "engine_port"),
        ("++env_config.learnable=[x]", "env_config"),
        ("custom.aclarena_response_budget=per_episode", "aclarena_response_budget must be one of total, per_turn"),
        ("rollout.num_steps_per_rollout=0", "num_steps_per_rollout must be positive"),
        ("rollout.over_sampling_batch_size=true", "over_sampling_batch_size"),
        ("rollout.over_sampling_batch_size=2", "over_sampling_prompts=2 is below prompts_per_step=4"),
        ("++cluster.local.base_adapter=/a lora.enabled=false", "full fine-tuning continues a model folder"),
    ],
)
def test_bad_settings_are_named(tmp_path, override, words):
    with pytest.raises((RecipeError, ValueError), match=words):
        local_session(tmp_path, *LEARNABLE, *override.split())


def test_a_builder_check_names_the_recipe(tmp_path):
    """A value the schema leaves to the local backend is refused by the builder, naming the stage and the setting."""
    with pytest.raises(RecipeError, match=r"stage1_math on the local backend: lr must be positive, got -1\.0"):
        local_session(tmp_path, *LEARNABLE, "algorithm.lr=-1.0")


def test_an_unset_response_budget_is_the_whole_trajectorys(tmp_path):
    """None (the recipe's unset custom.aclarena_response_budget) reads as the one check reads it: total."""
    session = local_session(tmp_path, *LEARNABLE, "custom.aclarena_response_budget=null")
    assert session.engine.budgets.mode == "total"


def test_unknown_keys_are_named(tmp_path):
    with pytest.raises(ValueError, match="stepz"):
        local_recipe(tmp_path, *LEARNABLE, "++cluster.local.stepz=3")


def test_cli_run_stage_composes_a_recipe_and_names_bad_settings(tmp_path, capsys):
    from aclarena_slime.cli import main

    recipe = str(Path(__file__).resolve().parents[2] / "recipes/stage1_math.yaml")
    assert main(["local", "run-stage", recipe, f"paths.root={tmp_path}", "algorithm.lr=-1"]) != 0
    assert "lr must be positive" in capsys.readouterr().err
    assert main(["local", "run-stage", recipe, f"paths.root={tmp_path}", "rollout.n_samplez=2"]) != 0
    assert "n_samplez" in capsys.readouterr().err
