"""LoraConfig: defaults from the paper, validation, and how slime's args reach it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from aclarena_slime.lora import LoraConfig, LoraConfigError


def test_paper_defaults_and_hf_targets():
    config = LoraConfig()
    assert (config.rank, config.alpha, config.scaling) == (16, 32.0, 2.0)
    assert (config.sync_mode, config.sync_dir) == ("disk", None)  # the recipe compiler fills sync_dir
    assert config.hf_target_modules() == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_from_args_dict_and_flat_attributes_flat_wins():
    args = SimpleNamespace(aclarena_lora={"rank": 8, "alpha": 16, "adapter_name": "math"}, aclarena_lora_rank=32)
    config = LoraConfig.from_args(args)
    assert (config.rank, config.alpha, config.adapter_name) == (32, 16, "math")


def test_target_modules_accept_a_comma_string():
    config = LoraConfig.from_mapping({"target_modules": "linear_qkv,linear_proj"})
    assert config.target_modules == ["linear_qkv", "linear_proj"]


def test_hugging_face_module_names_are_for_the_local_backend_only():
    config = LoraConfig.from_mapping({"target_modules": ["q_proj", "lm_head", "linear_fc2"]})
    assert config.hf_target_modules() == ["q_proj", "lm_head", "down_proj"]  # what PEFT adapts on the local backend
    with pytest.raises(LoraConfigError, match="only the local backend"):
        config.require_megatron_targets()
    with pytest.raises(LoraConfigError, match="only the local backend"):
        LoraConfig.from_args(SimpleNamespace(aclarena_lora={"target_modules": ["q_proj"]}))


@pytest.mark.parametrize(
    "values, message",
    [
        ({"rank": 0}, "rank"),
        ({"alpha": -1}, "alpha"),
        ({"dropout": 1.0}, "dropout"),
        ({"target_modules": ["q_projection"]}, "target_modules"),
        ({"sync_mode": "nfs"}, "sync_mode"),
        ({"adapter_name": "../math"}, "adapter_name"),
        ({"adapter_name": "math/v2"}, "adapter_name"),
        ({"sglang_payload": "v9"}, "sglang_payload"),
        ({"ranks": 8}, "unknown lora settings"),
    ],
)
def test_bad_settings_are_refused_by_name(values, message):
    with pytest.raises(LoraConfigError, match=message):
        LoraConfig.from_mapping(values)
