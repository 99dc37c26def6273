"""Shared fixtures for the local backend's tests: one tiny model on disk, one engine model per module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aclarena_slime.local.generation import MultiLoraModel
from aclarena_slime.local.tiny_model import save_tiny_checkpoint


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # The tiny model decodes fastest on one thread, and CI shares its cores.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-model"), with_model=True)


@pytest.fixture
def engine_model(tiny_model_dir: Path) -> MultiLoraModel:
    return MultiLoraModel.from_pretrained(tiny_model_dir, seed=0)


@pytest.fixture(scope="session")
def adapter_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PEFT adapter with non-zero B, so it changes the model's output."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"]),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    out = tmp_path_factory.mktemp("adapter") / "expert"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def reference_log_probs(tiny_model_dir: Path):
    """``fn(ids, out, temperature, adapter_dir=None)``: log-probs of ``out`` after ``ids`` from one plain
    transformers (and PEFT) forward of the whole sequence, as the trainer computes them."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from aclarena_slime.local.generation import token_log_probs

    models: dict[Path | None, torch.nn.Module] = {}

    def compute(ids: list[int], out: list[int], temperature: float, adapter: Path | None = None) -> list[float]:
        if adapter not in models:
            base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
            models[adapter] = (PeftModel.from_pretrained(base, str(adapter)) if adapter else base).eval()
        with torch.inference_mode():
            logits = models[adapter](input_ids=torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1]
        return token_log_probs(logits, torch.tensor(out), temperature).tolist()

    return compute
