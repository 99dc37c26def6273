"""Bytes per weight sync, adapter vs full model, for Qwen3-8B; and export + serialise time on the tiny model.

    python benchmarks/bench_lora_sync.py [--reps 5]

Qwen3-8B shapes from its config.json (Qwen/Qwen3-8B): 36 layers, hidden 4096, FFN 12288, 32 query
heads, 8 KV heads, head_dim 128, vocabulary 151936, untied embeddings. bf16 = 2 bytes a parameter.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 36, 4096, 12288, 32, 8, 128, 151936
# (in_features, out_features) of every HF projection LoRA targets, one layer.
PROJECTIONS = {
    "q_proj": (HIDDEN, HEADS * HEAD_DIM),
    "k_proj": (HIDDEN, KV_HEADS * HEAD_DIM),
    "v_proj": (HIDDEN, KV_HEADS * HEAD_DIM),
    "o_proj": (HEADS * HEAD_DIM, HIDDEN),
    "gate_proj": (HIDDEN, FFN),
    "up_proj": (HIDDEN, FFN),
    "down_proj": (FFN, HIDDEN),
}


def full_parameters() -> int:
    per_layer = sum(i * o for i, o in PROJECTIONS.values()) + 2 * HIDDEN + 2 * HEAD_DIM  # + norms, q/k norms
    return LAYERS * per_layer + 2 * VOCAB * HIDDEN + HIDDEN


def lora_parameters(rank: int) -> int:
    """PEFT layout: every projection has its own A (rank x in) and B (out x rank)."""
    return LAYERS * sum(rank * (i + o) for i, o in PROJECTIONS.values())


def measure_tiny_export(reps: int) -> tuple[float, float, int]:
    import torch

    from aclarena_slime.lora import LoraConfig, export_peft, inject_lora
    from aclarena_slime.lora.layers import randomize_adapters
    from aclarena_slime.lora.selftest import TinyQwen3, build_tiny_gpt, model_parallel
    from aclarena_slime.lora.sync import serialize_tensors

    config = LoraConfig(rank=16, alpha=32)
    with model_parallel(), tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_gpt(TinyQwen3(), seed=0)
        inject_lora(model, config)
        randomize_adapters(model, seed=1)
        export_times, serialise_times = [], []
        for _ in range(reps):
            start = time.perf_counter()
            tensors = export_peft(model, Path(tmp) / "adapter", config)
            export_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            blob = serialize_tensors(tensors)
            serialise_times.append(time.perf_counter() - start)
        del blob
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        torch.distributed.barrier()
    return min(export_times), min(serialise_times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    console = Console()
    full = full_parameters()
    table = Table(title="Bytes per weight sync, Qwen3-8B, bf16")
    for column in ("what is sent", "parameters", "bytes", "% of full"):
        table.add_column(column, justify="right")
    table.add_row("full weights", f"{full / 1e9:.2f} B", f"{2 * full / 1e9:.2f} GB", "100.00")
    for rank in (16, 32, 64):
        n = lora_parameters(rank)
        table.add_row(
            f"LoRA r={rank}, 7 projections", f"{n / 1e6:.1f} M", f"{2 * n / 1e6:.0f} MB", f"{100 * n / full:.2f}"
        )
    console.print(table)
    export_s, serialise_s, size = measure_tiny_export(args.reps)
    tiny = Table(title=f"Tiny Qwen3-shaped model, r=16 fp32 adapter ({size / 1e3:.0f} kB), best of {args.reps}")
    tiny.add_column("step")
    tiny.add_column("seconds", justify="right")
    tiny.add_row("gather + split + atomic PEFT write", f"{export_s:.4f}")
    tiny.add_row("serialise for /load_lora_adapter_from_tensors", f"{serialise_s:.4f}")
    console.print(tiny)


if __name__ == "__main__":
    main()
