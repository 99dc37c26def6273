"""LoRA layers on CUDA with plain megatron-core (no TransformerEngine, no SGLang): fp32 and bf16.

Run by tests/gpu/run_lora_gpu_check.sh on a GPU machine; prints one line per check and exits 1 on any
failure. Checks: the adapted model equals the backbone at init; switching adapters off gives the
backbone; the branch equals scaling * B(A(x)) on a real layer; a backward step changes adapter
weights only.
"""

from __future__ import annotations

import sys
import time

import torch

from aclarena_slime.lora import LoraConfig, adapters_disabled, inject_lora
from aclarena_slime.lora.layers import lora_modules, randomize_adapters
from aclarena_slime.lora.selftest import TinyQwen3, build_tiny_gpt, megatron_logits, model_parallel

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def check(dtype: torch.dtype) -> list[tuple[str, bool, str]]:
    results = []
    shape = TinyQwen3(
        hidden_size=256, ffn_hidden_size=512, num_layers=4, num_attention_heads=8, num_query_groups=2, head_dim=48
    )
    config = LoraConfig(rank=16, alpha=32)
    ids = torch.randint(0, shape.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0)).cuda()
    model = build_tiny_gpt(shape, seed=0, dtype=dtype, device="cuda")
    with torch.no_grad():
        backbone = megatron_logits(model, ids)
        inject_lora(model, config)
        init = megatron_logits(model, ids)
        results.append(
            (
                "init equals backbone",
                torch.equal(init, backbone),
                f"max diff {(init - backbone).abs().max().item():.2e}",
            )
        )
        randomize_adapters(model, seed=1, std=0.05)
        adapted = megatron_logits(model, ids)
        with adapters_disabled(model):
            off = megatron_logits(model, ids)
        effect = (adapted - backbone).abs().max().item()
        results.append(("adapters off equals backbone", torch.equal(off, backbone), f"adapter effect {effect:.3e}"))
        layer = next(lora_modules(model))
        x = torch.randn(64, 4, layer.weight.shape[1], device="cuda", dtype=dtype)
        with_lora = layer(x)[0]
        layer.lora_enabled = False
        without = layer(x)[0]
        layer.lora_enabled = True
        expected = (x.float() @ layer.lora_A.weight.float().T @ layer.lora_B.weight.float().T) * config.scaling
        err = ((with_lora.float() - without.float()) - expected).abs().max().item() / max(
            expected.abs().max().item(), 1e-6
        )
        results.append(("branch = scaling * B A x", err < TOLERANCE[dtype], f"relative error {err:.2e}"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    start = time.perf_counter()
    megatron_logits(model, ids).float().logsumexp(-1).mean().backward()
    optimizer.step()
    torch.cuda.synchronize()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    only_adapters = bool(changed) and all(".lora_" in n for n in changed)
    results.append(
        (
            "step changes adapters only",
            only_adapters,
            f"{len(changed)} tensors changed, {time.perf_counter() - start:.3f}s",
        )
    )
    return results


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU")
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    ok = True
    with model_parallel():
        for dtype in (torch.float32, torch.bfloat16):
            for name, passed, detail in check(dtype):
                ok &= passed
                print(f"{'PASS' if passed else 'FAIL'}  {str(dtype):15s} {name:32s} {detail}")
    print("LoRA GPU check:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
