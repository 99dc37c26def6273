from __future__ import annotations

from types import SimpleNamespace

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
    cfg = LocalStageConfig(env="math", output_dir="o", lora_target_modules=["linear_qkv", "linear_fc1", "o_proj"])
    assert cfg.lora_target_modules == ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "o_proj")


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
        ("lora_dropout", 1.0, "lora_dropout"),
        ("lora_target_modules", [], "lora_target_modules"),
        ("engine_port", 70000, "engine_port"),
        ("env_config", ["x"], "env_config"),
    ],
)
def test_bad_settings_are_named(field, value, words):
    with pytest.raises(LocalConfigError, match=words):
        LocalStageConfig(env="math", output_dir="o", **{field: value})


def test_unknown_keys_are_named():
    with pytest.raises(LocalConfigError, match="stepz"):
        LocalStageConfig.from_mapping({"env": "math", "output_dir": "o", "stepz": 3})


def test_cli_builds_the_config_and_names_bad_settings():
    from aclarena_slime.cli import CommandError
    from aclarena_slime.cli.local import config_from_args

    def args(*sets, env_config="{}"):
        return SimpleNamespace(env="math", output_dir="o", model="tiny", steps=3, env_config=env_config, set=list(sets))

    cfg = config_from_args(args("lr=0.01", 'lora_target_modules=["q_proj"]', "adapter_name=m1"))
    assert (cfg.steps, cfg.lr, cfg.lora_target_modules, cfg.expert_name) == (3, 0.01, ("q_proj",), "m1")
    with pytest.raises(CommandError, match="KEY=VALUE"):
        config_from_args(args("nonsense=1"))
    with pytest.raises(CommandError, match="lr"):
        config_from_args(args("lr=-1"))
    with pytest.raises(CommandError, match="env-config"):
        config_from_args(args(env_config="{x"))
