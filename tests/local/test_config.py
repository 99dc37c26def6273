from __future__ import annotations

from pathlib import Path

import pytest

from aclarena_slime.local.config import LocalConfigError, LocalStageConfig


def test_defaults_and_derived_paths(tmp_path):
    cfg = LocalStageConfig(env="search", output_dir=str(tmp_path))
    assert cfg.expert_name == "search"
    assert cfg.adapter_dir == tmp_path / "adapter"
    assert cfg.metrics_path == tmp_path / "metrics.json"
    assert cfg.model_source == "tiny"
    assert LocalStageConfig(env="search", output_dir="o", backbone="/b", model="/m").model_source == "/b"


def test_megatron_target_names_become_peft_names():
    cfg = LocalStageConfig(env="math", output_dir="o", lora={"target_modules": ["linear_qkv", "linear_fc1", "o_proj"]})
    assert cfg.lora.hf_target_modules() == ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "o_proj"]
    assert (cfg.lora.rank, cfg.lora.alpha, cfg.expert_name) == (8, 16.0, "math")  # the local default, over a mapping
    with pytest.raises(LocalConfigError, match="lm_heads"):
        LocalStageConfig(env="math", output_dir="o", lora={"target_modules": ["lm_heads"]})


def test_round_trip_through_a_mapping():
    cfg = LocalStageConfig(env="mock", output_dir="o", env_config={"max_turns": 2}, steps=3)
    assert LocalStageConfig.from_mapping(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("steps", 0, "steps"),
        ("samples_per_prompt", 1.5, "samples_per_prompt"),
        ("lr", 0.0, "lr"),
        ("temperature", 0.0, "temperature"),
        ("top_p", 1.5, "top_p"),
        ("lora", {"dropout": 1.0}, "dropout"),
        ("lora", {"target_modules": []}, "target_modules"),
        ("lora", {"rnak": 4}, "rnak"),
        ("engine_port", 70000, "engine_port"),
        ("env_config", ["x"], "env_config"),
        ("response_budget", "per_episode", "aclarena_response_budget must be one of total, per_turn"),
        ("steps_per_rollout", 0, "steps_per_rollout must be a positive integer"),
        ("over_sampling_prompts", True, "over_sampling_prompts must be a positive integer"),
    ],
)
def test_bad_settings_are_named(field, value, words):
    with pytest.raises(LocalConfigError, match=words):
        LocalStageConfig(env="math", output_dir="o", **{field: value})


def test_an_unset_response_budget_is_the_whole_trajectorys():
    """None (the recipe's unset custom.aclarena_response_budget) reads as the one check reads it: total."""
    assert LocalStageConfig(env="math", output_dir="o", response_budget=None).response_budget == "total"


def test_unknown_keys_are_named():
    with pytest.raises(LocalConfigError, match="stepz"):
        LocalStageConfig.from_mapping({"env": "math", "output_dir": "o", "stepz": 3})


def test_cli_run_stage_composes_a_recipe_and_names_bad_settings(tmp_path, capsys):
    from aclarena_slime.cli import main

    recipe = str(Path(__file__).resolve().parents[2] / "recipes/stage1_math.yaml")
    assert main(["local", "run-stage", recipe, f"paths.root={tmp_path}", "algorithm.lr=-1"]) != 0
    assert "lr must be positive" in capsys.readouterr().err
    assert main(["local", "run-stage", recipe, f"paths.root={tmp_path}", "rollout.n_samplez=2"]) != 0
    assert "n_samplez" in capsys.readouterr().err
