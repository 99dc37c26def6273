"""What a versioned adapter sync costs next to the plain one, on the local engine; and the checksum's cost.

    python benchmarks/bench_adapter_swap.py [--reps 9]

On the tiny model, through :func:`aclarena_slime.adapter_swap.swap_adapter` over HTTP: the plain swap
(unload, then load under the same name: what a synchronous run does) is the anchor; the versioned one
loads ``name@N`` beside the resident version, writes the ledger and unloads ``name@N-2`` (budget 1). Then
SHA-256 over the adapter folder as both sides check it: the tiny adapter, and bytes the size of a
Qwen3-8B r16 adapter (87 MB in bf16, PEFT layout) to show what it adds to a real sync.
Median wall and CPU milliseconds over the repetitions.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

QWEN3_8B_R16_BYTES = 87_000_000


def _adapter(model_dir: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(r=8, target_modules="all-linear")
    )
    model.save_pretrained(out)
    return out


async def _swaps(model_dir: Path, adapter: Path, reps: int, tmp: Path) -> dict[str, list[tuple[float, float]]]:
    from aclarena_slime.adapter_swap import AdapterLedger, swap_adapter
    from aclarena_slime.local.engine import LocalEngine
    from aclarena_slime.local.generation import MultiLoraModel
    from aclarena_slime.sglang_client import SGLangClient

    engine = LocalEngine(MultiLoraModel.from_pretrained(model_dir))
    times: dict[str, list[tuple[float, float]]] = {"plain": [], "versioned": []}
    async with engine.serve() as url:
        client = [SGLangClient(url)]
        await swap_adapter(client, "plain", adapter, loaded=False)
        ledger = AdapterLedger(tmp / "sync")
        for rep in range(reps):
            for kind in ("plain", "versioned"):
                wall, cpu = time.perf_counter(), time.process_time()
                if kind == "plain":
                    await swap_adapter(client, "plain", adapter)
                else:
                    await swap_adapter(client, "expert", adapter, version=rep, staleness_budget=1, ledger=ledger)
                times[kind].append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def _checksum(path: Path, reps: int) -> list[tuple[float, float]]:
    from aclarena_slime.adapter_swap import adapter_checksum

    out = []
    for _ in range(reps):
        wall, cpu = time.perf_counter(), time.process_time()
        adapter_checksum(path)
        out.append((time.perf_counter() - wall, time.process_time() - cpu))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    from aclarena_slime.local.tiny_model import save_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_dir = save_tiny_checkpoint(tmp / "model", with_model=True)
        adapter = _adapter(model_dir, tmp / "adapter")
        swaps = asyncio.run(_swaps(model_dir, adapter, args.reps, tmp))
        tiny = _checksum(adapter, args.reps)
        big = tmp / "big"
        big.mkdir()
        (big / "adapter_model.safetensors").write_bytes(os.urandom(QWEN3_8B_R16_BYTES))
        large = _checksum(big, max(3, args.reps // 3))
    table = Table(title=f"adapter swap on the local engine (tiny model), median of {args.reps}")
    for column in ("what", "wall ms", "CPU ms"):
        table.add_column(column, justify="right" if column != "what" else "left")

    def row(name: str, samples: list[tuple[float, float]]) -> None:
        table.add_row(name, f"{statistics.median(s[0] for s in samples) * 1e3:.1f}",
                      f"{statistics.median(s[1] for s in samples) * 1e3:.1f}")  # fmt: skip

    row("plain swap: unload + load (anchor)", swaps["plain"])
    row("versioned swap: load name@N, ledger, unload name@N-2", swaps["versioned"])
    row("checksum, tiny adapter folder", tiny)
    row("checksum, 87 MB (Qwen3-8B r16 bf16)", large)
    Console().print(table)
    rate = QWEN3_8B_R16_BYTES / statistics.median(s[0] for s in large) / 1e6
    print(f"sha256 here: {rate:.0f} MB/s (hashlib {hashlib.sha256().name}); load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
