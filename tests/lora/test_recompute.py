"""LoRA under megatron-core's activation recompute: the adapters must still get gradients.

Megatron's ``CheckpointFunction`` returns a tensor that tracks gradients only if one of its inputs does.
With a frozen embedding nothing does, so without a fix the loss has no graph to the adapters and
Megatron's schedule skips the backward silently (grad norm 0, B stays 0).
"""

from __future__ import annotations

import pytest
import torch

from aclarena_slime.lora import LoraConfig, inject_lora
from aclarena_slime.lora.layers import lora_modules
from aclarena_slime.lora.selftest import TinyQwen3, build_tiny_gpt, megatron_logits, megatron_on_cpu


@pytest.mark.parametrize("recompute", ["full", "selective", None])
def test_every_adapter_trains_under_recompute(tp1, recompute):
    shape = TinyQwen3(num_layers=3)
    model = build_tiny_gpt(shape, seed=0, recompute=recompute)
    inject_lora(model, LoraConfig(rank=4, alpha=8))
    model.train()
    ids = torch.randint(0, shape.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = megatron_logits(model, ids)
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, shape.vocab_size).float(), ids[:, 1:].reshape(-1)
    )
    assert loss.requires_grad, "the loss has no graph to the adapters"
    with megatron_on_cpu():  # the backward recomputes the checkpointed blocks
        loss.backward()
    modules = list(lora_modules(model))
    # At init B = 0, so A's gradient is zero by construction; B's must be non-zero everywhere.
    assert all(m.lora_B.weight.grad is not None and m.lora_B.weight.grad.abs().sum() > 0 for m in modules)
    assert all(p.grad is None for n, p in model.named_parameters() if ".lora_" not in n)
    before = [m.lora_B.weight.detach().clone() for m in modules]
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1).step()
    assert all(not torch.equal(m.lora_B.weight, b) for m, b in zip(modules, before, strict=True))
