"""One tensor-parallel rank of the TP=2 test, run as its own process (gloo on CPU).

argv: RANK SIZE PORT WORKDIR. Reads WORKDIR/backbone.pt (a TP=1 state dict), writes WORKDIR/rank<R>.pt,
a full dist-checkpoint and an adapter-only checkpoint (``aclarena_slime.lora.checkpoint``).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch

from aclarena_slime.lora import LoraConfig, export_peft, inject_lora
from aclarena_slime.lora.checkpoint import save_adapter_checkpoint
from aclarena_slime.lora.export import AttentionShape, gather_adapter, to_peft_state_dict
from aclarena_slime.lora.layers import lora_modules, randomize_adapters
from aclarena_slime.lora.selftest import TinyQwen3, build_tiny_gpt, megatron_logits, megatron_on_cpu, model_parallel
from aclarena_slime.lora.tp_layout import backbone_layout, shard


@contextmanager
def no_cuda_sync():
    """dist-checkpointing syncs and places a flag on the CUDA device; a CPU test has neither."""
    with megatron_on_cpu(), mock.patch("torch.cuda.synchronize", lambda *args, **kwargs: None):
        yield


CONFIG = LoraConfig(rank=4, alpha=8)
SHAPE = TinyQwen3(num_layers=2)


def adapted_run(model, rank: int, size: int, workdir: Path) -> dict:
    """Inject, randomise, forward, one SGD step; the same procedure at any TP size."""
    inject_lora(model, CONFIG)
    randomize_adapters(model, seed=7, std=0.2)
    ids = torch.randint(0, SHAPE.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    logits = megatron_logits(model, ids)
    before = export_peft(model, workdir / "adapter", CONFIG, write=rank == 0)
    logits.float().logsumexp(-1).mean().backward()
    torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5).step()
    after = export_peft(model, workdir / "adapter_after", CONFIG, write=False)
    return {"logits": logits.detach(), "peft": before, "peft_after_step": after}


def main(rank: int, size: int, port: int, workdir: Path) -> None:
    full = torch.load(workdir / "backbone.pt")
    with model_parallel(rank, size, port):
        model = build_tiny_gpt(SHAPE, seed=0)
        gated = model.config.gated_linear_unit
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(shard(full[name], backbone_layout(name, param, gated), rank, size))
        result = adapted_run(model, rank, size, workdir)
        from megatron.core import dist_checkpointing

        ckpt = workdir / f"ckpt_tp{size}"
        ckpt.mkdir(exist_ok=True)
        torch.distributed.barrier()
        with no_cuda_sync():
            dist_checkpointing.save(model.sharded_state_dict(), str(ckpt))
            save_adapter_checkpoint(workdir / f"adapter_ckpt_tp{size}", 5, [model], None)
        result["peft_from_copy"] = from_copy_after_poison(model)
    torch.save(result, workdir / f"rank{rank}.pt")


def from_copy_after_poison(model) -> dict:
    """The updater's path: this rank's CPU copy (slime's names), gathered over TP, the live adapter NaN."""
    copy = {f"module.module.{n}": p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for module in lora_modules(model):
            module.lora_A.weight.fill_(float("nan"))
            module.lora_B.weight.fill_(float("nan"))
    return to_peft_state_dict(gather_adapter(model, copy), AttentionShape.from_megatron(model.config))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
