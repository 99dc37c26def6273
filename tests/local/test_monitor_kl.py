"""RL's Razor's predictor as the local monitor computes it: KL(current || starting policy), exact over the
vocabulary, on the current policy's episodes of each earlier domain (real PEFT adapters on the tiny model)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from aclarena_slime.evaluation.monitor import policy_kl


def _scaled(adapter: Path, factor: float, out: Path) -> Path:
    """A copy of ``adapter`` with its B matrices times ``factor`` (0: the base model's policy)."""
    shutil.copytree(adapter, out)
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    save_file(
        {k: v * factor if "lora_B" in k else v for k, v in weights.items()}, str(out / "adapter_model.safetensors")
    )
    return out


@pytest.fixture(scope="module")
def episodes() -> dict[str, list[tuple[list[int], list[int]]]]:
    g = torch.Generator().manual_seed(0)
    rows = [(torch.randint(3, 200, (12,), generator=g).tolist(), [0, 1, 1, 1, 0, 1]) for _ in range(3)]
    return {"math": rows, "search": [(rows[0][0], [0] * 6)]}  # search: no model-written token


def test_kl_is_zero_to_itself_and_grows_as_the_policy_moves_away(tiny_model_dir, adapter_dir, tmp_path, episodes):
    start = _scaled(adapter_dir, 0.0, tmp_path / "start")
    assert policy_kl(tiny_model_dir, start, start, True, episodes) == {"math": 0.0}
    near = policy_kl(tiny_model_dir, _scaled(adapter_dir, 0.2, tmp_path / "near"), start, True, episodes)["math"]
    far = policy_kl(tiny_model_dir, adapter_dir, start, True, episodes)["math"]
    assert 0.0 < near < far  # "search" wrote no token of its own: no figure rather than a made-up 0
    backwards = policy_kl(tiny_model_dir, start, adapter_dir, True, episodes)["math"]
    assert backwards != pytest.approx(far)  # KL(current || start), not a symmetric distance


def test_full_fine_tuning_compares_two_model_folders(tiny_model_dir, tmp_path, episodes):
    from transformers import AutoModelForCausalLM

    moved = tmp_path / "moved"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)
    model.save_pretrained(moved)
    assert policy_kl(tiny_model_dir, tiny_model_dir, tiny_model_dir, False, episodes) == {"math": 0.0}
    assert policy_kl(tiny_model_dir, moved, tiny_model_dir, False, episodes)["math"] > 0.0
