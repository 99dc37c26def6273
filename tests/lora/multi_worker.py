"""One rank of the stacked-adapter (parallel MLE) test, run in-process at TP=1 or as a gloo process at TP=2.

argv: RANK SIZE PORT WORKDIR. Reads WORKDIR/backbone.pt (a TP=1 state dict), writes WORKDIR/multi_rank<R>.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from aclarena_slime.lora import LoraConfig, inject_lora
from aclarena_slime.lora.export import gather_adapter
from aclarena_slime.lora.layers import adapter_index, lora_modules, randomize_adapters, select_expert
from aclarena_slime.lora.selftest import TinyQwen3, build_tiny_gpt, megatron_logits, model_parallel
from aclarena_slime.lora.tp_layout import backbone_layout, shard

EXPERTS = ["math", "search"]
CONFIG = LoraConfig(rank=4, alpha=8, experts=EXPERTS)
SHAPE = TinyQwen3(num_layers=2)
IDS = torch.randint(0, SHAPE.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
# Sample 0 is a math sample, sample 1 a search sample: megatron-core's [sequence, batch] layout.
INDEX = torch.tensor([0, 1]).expand(IDS.shape[1], 2)


def load_backbone(full: dict, rank: int, size: int) -> torch.nn.Module:
    model = build_tiny_gpt(SHAPE, seed=0)
    gated = model.config.gated_linear_unit
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(shard(full[name], backbone_layout(name, param, gated), rank, size))
    return model


def grads(model) -> dict[str, torch.Tensor]:
    """Each adapted layer's logical (TP=1) gradient of A and B: a TP collective."""
    out = {}
    for module in lora_modules(model):
        for name in ("lora_A", "lora_B"):
            grad = getattr(module, name).weight.grad
            out[f"{module.lora_key}.{name}"] = module.lora_full(name, torch.zeros_like(grad) if grad is None else grad)
    return out


def multi_run(full: dict, rank: int, size: int) -> dict:
    """Stacked experts: mixed-batch logits, each expert alone, gradients of sample 0's loss, one SGD step."""
    model = load_backbone(full, rank, size)
    inject_lora(model, CONFIG)
    randomize_adapters(model, seed=7, std=0.2)  # experts differ, so a wrong selection shows in the logits
    stacked = gather_adapter(model)
    with adapter_index(model, INDEX):
        logits = megatron_logits(model, IDS)
        logits[0].float().logsumexp(-1).mean().backward()  # the math sample's loss only (logits: [batch, seq, vocab])
    only_math = grads(model)
    model.zero_grad(set_to_none=True)
    with adapter_index(model, INDEX):
        megatron_logits(model, IDS).float().logsumexp(-1).mean().backward()  # both samples
    both = grads(model)
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5).step()
    after = gather_adapter(model)
    alone = {}
    for k, tag in enumerate(EXPERTS):  # expert k in a one-adapter model: the logits of its own sample
        single = load_backbone(full, rank, size)
        inject_lora(single, LoraConfig(rank=4, alpha=8, adapter_name=tag))
        expert = select_expert(stacked, k, CONFIG.rank)
        for module in lora_modules(single):
            for name in ("lora_A", "lora_B"):
                module.lora_set_full(name, expert[f"{module.lora_key}.{name}"])
        alone[tag] = megatron_logits(single, IDS).detach()
    return {
        "logits": logits.detach(),
        "alone": alone,
        "grads_math_sample": only_math,
        "grads_both": both,
        "after": {tag: select_expert(after, k, CONFIG.rank) for k, tag in enumerate(EXPERTS)},
    }


def main(rank: int, size: int, port: int, workdir: Path) -> None:
    full = torch.load(workdir / "backbone.pt")
    with model_parallel(rank, size, port):
        result = multi_run(full, rank, size)
    torch.save(result, workdir / f"multi_rank{rank}.pt")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
