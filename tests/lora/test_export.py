"""PEFT export: q/k/v de-interleaving, atomic directory replacement, and the selftest CLI."""

from __future__ import annotations

import json

import pytest
import torch

from aclarena_slime.lora import LoraConfig
from aclarena_slime.lora import export as export_module
from aclarena_slime.lora.export import AttentionShape, peft_adapter_config, split_qkv_rows, write_peft_dir


def test_split_qkv_rows_per_query_group():
    shape = AttentionShape(num_attention_heads=4, num_query_groups=2, head_dim=1)
    # Two groups of [q, q, k, v] rows, each row labelled by its value.
    fused = torch.tensor([0.0, 1, 10, 20, 2, 3, 11, 21]).unsqueeze(1)
    q, k, v = split_qkv_rows(fused, shape)
    assert q.flatten().tolist() == [0, 1, 2, 3]
    assert k.flatten().tolist() == [10, 11]
    assert v.flatten().tolist() == [20, 21]


def test_adapter_config_is_what_peft_reads():
    config = peft_adapter_config(LoraConfig(rank=8, alpha=16), base_model="Qwen/Qwen3-8B")
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (8, 16, "LORA")
    assert set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }


def test_write_replaces_an_existing_adapter(tmp_path):
    target = tmp_path / "math"
    write_peft_dir(target, {"a": torch.zeros(2)}, {"r": 1})
    write_peft_dir(target, {"a": torch.ones(2)}, {"r": 2})
    assert json.loads((target / "adapter_config.json").read_text()) == {"r": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["math"]


def test_a_crash_mid_write_keeps_the_good_adapter(tmp_path, monkeypatch):
    target = tmp_path / "math"
    write_peft_dir(target, {"a": torch.zeros(2)}, {"r": 1})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export_module, "save_safetensors", crash)  # the adapter bytes fail mid-write
    with pytest.raises(OSError, match="disk full"):
        write_peft_dir(target, {"a": torch.ones(2)}, {"r": 2})
    assert json.loads((target / "adapter_config.json").read_text()) == {"r": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["math"]


def test_selftest_command_reproduces_logits(tmp_path, capsys):
    from aclarena_slime.cli import main

    assert main(["lora", "selftest", "--out", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["init_equals_backbone"]
    assert report["max_abs_logit_diff"] <= 1e-4
    assert report["adapter_effect"] > 1e-2  # the adapter really changes the model
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
