"""Adapters on a TP=1 megatron-core model: identity at init, frozen backbone, on/off, checkpoints."""

from __future__ import annotations

import pytest
import torch

from aclarena_slime.lora import LoraConfig, LoraConfigError, adapters_disabled, inject_lora
from aclarena_slime.lora.config import ADAPTER_PARAM_PATTERN
from aclarena_slime.lora.layers import lora_modules, randomize_adapters
from aclarena_slime.lora.selftest import megatron_logits


def _ids(shape, seed=0):
    return torch.randint(0, shape.vocab_size, (2, 12), generator=torch.Generator().manual_seed(seed))


def test_wrapped_model_equals_backbone_at_init(tiny_model, tiny_shape):
    ids = _ids(tiny_shape)
    with torch.no_grad():
        before = megatron_logits(tiny_model, ids)
        keys = inject_lora(tiny_model, LoraConfig(rank=4, alpha=8))
        after = megatron_logits(tiny_model, ids)
    assert len(keys) == 4 * tiny_shape.num_layers
    assert torch.equal(before, after)
    # A is random (Kaiming), B is zero: the branch is live but contributes nothing yet.
    module = next(lora_modules(tiny_model))
    assert module.lora_A.weight.abs().sum() > 0 and module.lora_B.weight.abs().sum() == 0


def test_only_adapter_parameters_train_and_change(tiny_model, tiny_shape):
    inject_lora(tiny_model, LoraConfig(rank=4, alpha=8))
    trainable = {n for n, p in tiny_model.named_parameters() if p.requires_grad}
    import re

    assert trainable and all(re.search(ADAPTER_PARAM_PATTERN, n) for n in trainable)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in tiny_model.parameters() if p.requires_grad], lr=0.1)
    logits = megatron_logits(tiny_model, _ids(tiny_shape))
    logits.float().logsumexp(-1).mean().backward()
    optimizer.step()
    changed = {n for n, p in tiny_model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and changed <= trainable
    assert any(".lora_B." in n for n in changed)


def test_adapters_disabled_gives_the_backbone(tiny_model, tiny_shape):
    ids = _ids(tiny_shape)
    with torch.no_grad():
        backbone = megatron_logits(tiny_model, ids)
        inject_lora(tiny_model, LoraConfig(rank=4, alpha=8))
        randomize_adapters(tiny_model, seed=3, std=0.2)
        adapted = megatron_logits(tiny_model, ids)
        with adapters_disabled(tiny_model):
            off = megatron_logits(tiny_model, ids)
        again = megatron_logits(tiny_model, ids)
    assert not torch.allclose(adapted, backbone)
    assert torch.equal(off, backbone)
    assert torch.equal(again, adapted)


def test_backbone_checkpoint_without_adapter_keys_loads(tiny_model):
    backbone_state = dict(tiny_model.state_dict())
    inject_lora(tiny_model, LoraConfig(rank=4, alpha=8))
    result = tiny_model.load_state_dict(backbone_state, strict=True)
    assert not result.missing_keys
    b = next(lora_modules(tiny_model)).lora_B.weight
    assert b.abs().sum() == 0


def test_checkpoint_with_part_of_the_adapter_is_refused(tiny_model):
    inject_lora(tiny_model, LoraConfig(rank=4, alpha=8))
    state = tiny_model.state_dict()
    state.pop(next(k for k in state if k.endswith("lora_B.weight")))
    with pytest.raises(RuntimeError, match="lora_B"):
        tiny_model.load_state_dict(state, strict=True)


def test_adapter_round_trips_through_state_dict(tiny_model, tiny_shape):
    inject_lora(tiny_model, LoraConfig(rank=4, alpha=8))
    randomize_adapters(tiny_model, seed=5)
    saved = {k: v.clone() if torch.is_tensor(v) else v for k, v in tiny_model.state_dict().items()}
    for module in lora_modules(tiny_model):
        module.lora_B.weight.data.zero_()
    tiny_model.load_state_dict(saved)
    assert all(torch.equal(tiny_model.state_dict()[k], v) for k, v in saved.items() if "lora_" in k)


def test_sequence_parallel_is_refused(tiny_model):
    tiny_model.config.sequence_parallel = True
    for module in tiny_model.modules():
        if hasattr(module, "config"):
            module.config.sequence_parallel = True
    with pytest.raises(LoraConfigError, match="sequence parallel"):
        inject_lora(tiny_model, LoraConfig())


def test_injecting_twice_is_refused(tiny_model):
    inject_lora(tiny_model, LoraConfig(rank=2, alpha=2))
    with pytest.raises(LoraConfigError, match="already"):
        inject_lora(tiny_model, LoraConfig(rank=2, alpha=2))


def test_target_subset_only_adapts_those(tiny_model):
    keys = inject_lora(tiny_model, LoraConfig(rank=2, alpha=2, target_modules=("linear_qkv",)))
    assert keys == ["layers.0.linear_qkv", "layers.1.linear_qkv"]
