"""LoRA training on megatron-core, end to end, as slime runs it: prints one JSON summary, exits 1 on a failure.

A small Qwen3-shaped model (GQA, q/k norms, SwiGLU) with LoRA on its four linears, full uniform
activation recompute, Megatron's DDP, its distributed optimizer (bf16, grad clipping) and LR scheduler,
three steps on one batch. Checks: the loss falls; every adapter tensor gets a non-zero gradient; the
backbone is bit-identical afterwards; the adapter-only checkpoint (``aclarena_slime.lora.checkpoint``)
holds no backbone tensor and loads into a fresh model and optimizer equal, and a step after the reload
gives the loss the original run gives.

On a GPU (one H200: well under a minute once imports are done): ``bash tests/gpu/run_lora_gpu_check.sh``.
Without one, ``--device cpu`` runs the same on CPU with gloo, except that Megatron's distributed
optimizer and its gradient clipping require CUDA: fp32, the plain Megatron optimizer, no clipping.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

from aclarena_slime.lora import LoraConfig, inject_lora
from aclarena_slime.lora import checkpoint as ckpt
from aclarena_slime.lora.megatron_train import build_training, megatron_training_on_cpu, train_step
from aclarena_slime.lora.selftest import TinyQwen3, build_tiny_gpt, model_parallel

SHAPE = TinyQwen3(
    vocab_size=1024, hidden_size=256, ffn_hidden_size=768, num_layers=4, num_attention_heads=8,
    num_query_groups=2, head_dim=64, max_positions=256,
)  # fmt: skip
STEPS = 3


def _setup(device: str):
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    model = build_tiny_gpt(SHAPE, seed=0, dtype=dtype, device=device, recompute="full")
    inject_lora(model, LoraConfig(rank=16, alpha=32))
    return build_training(model, lr=2e-3, distributed_optimizer=cuda, clip_grad=1.0 if cuda else 0.0)


def _adapter(ddp) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in ddp.named_parameters() if ".lora_" in n}


def _optimizer_tensors(optimizer) -> list[torch.Tensor]:
    """Main parameters and Adam moments of every optimizer in the chain, in the optimizer's own order."""
    out = []
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        for group in inner.optimizer.param_groups:
            for param in group["params"]:
                state = inner.optimizer.state[param]
                out.append(param.detach().clone())
                out.extend(state[k].clone() for k in sorted(state) if torch.is_tensor(state[k]))
    return out


def run(device: str, out_dir: Path) -> dict:
    ids = torch.randint(0, SHAPE.vocab_size, (4, 128), generator=torch.Generator().manual_seed(0)).to(device)
    ddp, optimizer, scheduler = _setup(device)
    backbone = {n: p.detach().clone() for n, p in ddp.named_parameters() if ".lora_" not in n}
    grad_max: dict[str, float] = {n: 0.0 for n in _adapter(ddp)}

    def record(model) -> None:
        for name, param in model.named_parameters():
            grad = getattr(param, "main_grad", None)
            if name in grad_max and grad is not None:
                grad_max[name] = max(grad_max[name], grad.abs().max().item())

    start = time.perf_counter()
    losses, norms = [], []
    for _ in range(STEPS):
        loss, norm = train_step(ddp, optimizer, scheduler, ids, on_grads=record)
        losses.append(loss)
        norms.append(norm)
    train_seconds = time.perf_counter() - start
    changed_backbone = [n for n, p in ddp.named_parameters() if ".lora_" not in n and not torch.equal(p, backbone[n])]

    path = ckpt.save_adapter_checkpoint(out_dir / "lora_adapter", STEPS, [ddp], optimizer, scheduler)
    from megatron.core.dist_checkpointing import load_tensors_metadata

    keys = set(load_tensors_metadata(str(path)))
    saved_adapter, saved_optimizer = _adapter(ddp), _optimizer_tensors(optimizer)
    saved_scheduler = (scheduler.num_steps, scheduler.get_lr(optimizer.param_groups[0]))
    next_loss = train_step(ddp, optimizer, scheduler, ids)[0]

    ddp2, optimizer2, scheduler2 = _setup(device)
    resumed = ckpt.load_adapter_checkpoint(out_dir / "lora_adapter", [ddp2], optimizer2, scheduler2)
    scheduler_equal = (scheduler2.num_steps, scheduler2.get_lr(optimizer2.param_groups[0])) == saved_scheduler
    adapter_equal = all(torch.equal(_adapter(ddp2)[k], v) for k, v in saved_adapter.items())
    loaded_optimizer = _optimizer_tensors(optimizer2)
    optimizer_equal = len(loaded_optimizer) == len(saved_optimizer) and all(
        torch.equal(a, b) for a, b in zip(loaded_optimizer, saved_optimizer, strict=True)
    )
    resumed_loss = train_step(ddp2, optimizer2, scheduler2, ids)[0]
    per_layer = {re.sub(r"layers\.\d+\.", "layers.", n) for n in saved_adapter}
    checks = {
        "loss_falls": all(b < a for a, b in zip(losses, losses[1:], strict=False)),
        "every_adapter_has_a_gradient": all(v > 0 for v in grad_max.values()),
        "backbone_bit_identical": not changed_backbone,
        "checkpoint_holds_only_the_adapter": {k for k in keys if not k.startswith("optimizer.")} == per_layer
        and all(".lora_" in k for k in keys),
        "checkpoint_adapter_loads_equal": resumed == STEPS and adapter_equal,
        "checkpoint_optimizer_loads_equal": optimizer_equal and scheduler_equal,
        "step_after_reload_matches": abs(resumed_loss - next_loss) <= 1e-5 * max(1.0, abs(next_loss)),
    }
    return {
        "ok": all(checks.values()),
        "checks": checks,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "dtype": "bf16" if device == "cuda" else "fp32",
        "distributed_optimizer": device == "cuda",
        "recompute": "full/uniform/1",
        "torch": torch.__version__,
        "losses": losses,
        "grad_norms": norms,
        "adapter_tensors": len(grad_max),
        "adapter_tensors_without_gradient": [n for n, v in grad_max.items() if v == 0],
        "backbone_tensors_changed": changed_backbone,
        "checkpoint_keys": len(keys),
        "loss_after_reload": resumed_loss,
        "loss_without_reload": next_loss,
        "train_seconds": round(train_seconds, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "no CUDA device; run with --device cpu"}))
        return 2
    with tempfile.TemporaryDirectory() as tmp, model_parallel():
        if args.device == "cuda":
            summary = run("cuda", Path(tmp))
        else:
            with megatron_training_on_cpu():
                summary = run("cpu", Path(tmp))
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":  # dist-checkpointing starts helper processes: keep the guard
    sys.exit(main())
