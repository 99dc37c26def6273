"""Tokens per second of the local backend's embedded engine, over HTTP as the rollout uses it.

    python benchmarks/bench_local_engine.py [--model tiny|HF_DIR] [--tokens 128] [--requests 8] [--threads 1]

Rows: one request at a time, with and without a LoRA adapter, then ``--requests`` requests in flight
at once (the engine serves them one after another: there is no batching, which this row shows).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.generation import MultiLoraModel
from aclarena_slime.local.stage import prepare_model
from aclarena_slime.local.trainer import PolicyTrainer, TrainSettings
from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.sglang_client import SGLangClient, output_tokens


async def timed(client: SGLangClient, prompt: list[int], n: int, tokens: int, lora: str | None) -> tuple[int, float]:
    params = {"temperature": 1.0, "max_new_tokens": tokens, "ignore_eos": True}
    start = time.perf_counter()
    results = await asyncio.gather(
        *(client.generate(prompt, {**params, "sampling_seed": i}, lora_path=lora) for i in range(n))
    )
    return sum(len(output_tokens(r)[0]) for r in results), time.perf_counter() - start


async def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = prepare_model(args.model, Path(tmp), seed=0)
        lora = LoraConfig(
            rank=16,
            alpha=32,
            dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
        trainer = PolicyTrainer.build(model_dir, TrainSettings(), lora)
        adapter = trainer.save(Path(tmp) / "adapter")
        engine = LocalEngine(MultiLoraModel.from_pretrained(model_dir))
        prompt = engine.chat.prompt_ids([{"role": "user", "content": "Write a long story about numbers."}])
        async with engine.serve() as url:
            client = SGLangClient(url)
            await client.load_lora_adapter("expert", str(adapter))
            await timed(client, prompt, 1, 8, None)  # warm-up
            rows = [
                ("1 request, base model", *await timed(client, prompt, 1, args.tokens, None)),
                ("1 request, LoRA r16 on 7 linears", *await timed(client, prompt, 1, args.tokens, "expert")),
                (
                    f"{args.requests} requests in flight, LoRA",
                    *await timed(client, prompt, args.requests, args.tokens, "expert"),
                ),
            ]
    table = Table(
        title=f"local engine: model={args.model}, prompt {len(prompt)} tokens, {args.threads} torch thread(s)"
    )
    for col in ("case", "tokens", "seconds", "tokens/s", "ms/token"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for name, n, secs in rows:
        table.add_row(name, str(n), f"{secs:.2f}", f"{n / secs:.1f}", f"{1000 * secs / n:.2f}")
    Console().print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (built in-process) or a Hugging Face model directory")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    parser.add_argument("--requests", type=int, default=8, help="requests in flight in the last row")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    asyncio.run(main(parser.parse_args()))
