"""Tokens per second of the local backend's embedded engine, over HTTP as the rollout uses it.

    python benchmarks/bench_local_engine.py [--tokens 48] [--threads 2] [--sizes 64x2,256x4] [--repeat 3]

Per model size (Qwen3-shaped, built in-process: the tests' tiny one, 64 wide with 2 layers, and one
256 wide with 4 layers), the same 64 chat prompts of varied length are served:

- one at a time (a few requests, each waiting for the last), then 8 and 64 in flight at once, half
  of them on a LoRA adapter (rank 16 on all seven projections), through ``SGLangClient`` against the
  engine's HTTP server;
- the anchor a user would otherwise pick: Hugging Face ``generate`` on the base model with the 64
  prompts in one left-padded batch, sampling, the same number of new tokens;
- the worst absolute difference between the log-probs the engine reported for the 64 and a plain
  transformers (+ PEFT) forward of prompt + response.

Every request samples exactly ``--tokens`` tokens (``ignore_eos``). Each case runs ``--repeat`` times
and the fastest run counts; beside its wall seconds the table gives the CPU seconds this process
spent (engine, HTTP client and server alike: one process), and the ratios per CPU second, which move
less than wall time when other jobs share the cores. The machine's load average is printed with the
table: the numbers are only comparable at similar load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.generation import MultiLoraModel, token_log_probs
from aclarena_slime.local.tiny_model import TinyShape, save_tiny_checkpoint
from aclarena_slime.sglang_client import SGLangClient, output_tokens

TOPICS = ["numbers", "the sea", "a fox", "Paris", "tools", "prime numbers", "a long journey", "json"]


def prompts(engine: LocalEngine, n: int) -> list[list[int]]:
    """``n`` chat prompts of varied length (as a rollout's are)."""
    out = []
    for i in range(n):
        text = f"Write about {TOPICS[i % len(TOPICS)]}." + " Be precise and brief." * (i % 5)
        out.append(engine.chat.prompt_ids([{"role": "user", "content": text}]))
    return out


def make_adapter(model_dir: Path, out: Path) -> Path:
    """A rank-16 PEFT adapter on the seven projections, with non-zero B so that it changes the output."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(r=16, lora_alpha=32, target_modules=targets)
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    model.save_pretrained(out)
    return out


async def served(
    client: SGLangClient, jobs: list[tuple[list[int], str | None]], tokens: int, in_flight: int
) -> tuple[list[tuple[list[int], list[float]]], float, float]:
    """Serve ``jobs`` with at most ``in_flight`` requests at once; the outputs, wall and CPU seconds taken."""
    params = {"temperature": 1.0, "max_new_tokens": tokens, "ignore_eos": True}
    limit = asyncio.Semaphore(in_flight)

    async def one(i: int, ids: list[int], lora: str | None) -> tuple[list[int], list[float]]:
        async with limit:
            return output_tokens(await client.generate(ids, {**params, "sampling_seed": i}, lora_path=lora))

    start, cpu = time.perf_counter(), time.process_time()
    outs = await asyncio.gather(*(one(i, ids, lora) for i, (ids, lora) in enumerate(jobs)))
    return outs, time.perf_counter() - start, time.process_time() - cpu


def hf_generate(
    model_dir: Path, batch: list[list[int]], tokens: int, pad: int, repeat: int
) -> tuple[int, float, float]:
    """Hugging Face ``generate`` on the base model, the prompts in one left-padded batch; tokens, wall and CPU
    seconds of the fastest of ``repeat`` runs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    longest = max(len(ids) for ids in batch)
    input_ids = torch.tensor([[pad] * (longest - len(ids)) + ids for ids in batch])
    mask = torch.tensor([[0] * (longest - len(ids)) + [1] * len(ids) for ids in batch])
    kwargs = {"do_sample": True, "max_new_tokens": tokens, "min_new_tokens": tokens, "pad_token_id": pad}
    with torch.inference_mode():
        model.generate(input_ids=input_ids[:2], attention_mask=mask[:2], **{**kwargs, "max_new_tokens": 4})  # warm-up
        runs = []
        for _ in range(repeat):
            start, cpu = time.perf_counter(), time.process_time()
            out = model.generate(input_ids=input_ids, attention_mask=mask, **kwargs)
            runs.append((time.perf_counter() - start, time.process_time() - cpu))
    return (int((out.shape[1] - longest) * out.shape[0]), *min(runs))


def worst_log_prob_gap(
    model_dir: Path, adapter: Path, jobs: list[tuple[list[int], str | None]], outs: list[tuple[list[int], list[float]]]
) -> float:
    """The largest |engine log-prob - plain forward log-prob| over every token of ``outs``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), str(adapter)
    ).eval()
    worst = 0.0
    with torch.inference_mode():
        for (ids, lora), (out, log_probs) in zip(jobs, outs, strict=True):
            model = tuned if lora else base
            logits = model(input_ids=torch.tensor([ids + out])).logits[0, len(ids) - 1 : -1]
            expected = token_log_probs(logits, torch.tensor(out), 1.0)
            worst = max(worst, float((expected - torch.tensor(log_probs)).abs().max()))
    return worst


async def bench_size(
    shape: TinyShape, tokens: int, root: Path, repeat: int
) -> tuple[list[tuple[str, int, float, float]], float]:
    model_dir = save_tiny_checkpoint(root / f"model-{shape.hidden_size}x{shape.num_layers}", True, shape=shape)
    adapter = make_adapter(model_dir, root / f"adapter-{shape.hidden_size}x{shape.num_layers}")
    engine = LocalEngine(MultiLoraModel.from_pretrained(model_dir))
    batch = prompts(engine, 64)
    jobs = [(ids, "expert" if i % 2 else None) for i, ids in enumerate(batch)]
    rows = []
    async with engine.serve() as url:
        client = SGLangClient(url)
        await client.load_lora_adapter("expert", str(adapter))
        await served(client, jobs[:8], 4, 8)  # warm-up
        for name, n, in_flight in (("one at a time", 4, 1), ("8 in flight", 8, 8), ("64 in flight", 64, 64)):
            runs = [await served(client, jobs[:n], tokens, in_flight) for _ in range(repeat)]
            outs, seconds, cpu = min(runs, key=lambda run: run[1])
            rows.append((name, sum(len(o[0]) for o in outs), seconds, cpu))
    gap = worst_log_prob_gap(model_dir, adapter, jobs, outs)
    pad = engine.model.tokenizer.pad_token_id or 0
    rows.append(("HF generate, 64 in one batch", *hf_generate(model_dir, batch, tokens, pad, repeat)))
    return rows, gap


async def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    sizes = [TinyShape(hidden_size=int(w), num_layers=int(d)) for w, d in (s.split("x") for s in args.sizes.split(","))]
    load = os.getloadavg()
    table = Table(
        title=f"local engine over HTTP: {args.tokens} new tokens per request, {args.threads} torch thread(s), "
        f"half the requests on a LoRA r16 adapter; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    columns = ("model", "case", "tokens", "seconds", "CPU s", "tokens/s", "x one at a time", "x HF generate")
    for col in (*columns, "x one (CPU)", "x HF (CPU)"):
        table.add_column(col, justify="left" if col in ("model", "case") else "right")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in sizes:
            rows, gap = await bench_size(shape, args.tokens, Path(tmp), args.repeat)
            (_, n1, wall1, cpu1), (_, n_hf, wall_hf, cpu_hf) = rows[0], rows[-1]
            for name, n, secs, cpu in rows:
                rate = n / secs
                table.add_row(
                    f"{shape.hidden_size} wide, {shape.num_layers} layers",
                    name,
                    str(n),
                    f"{secs:.2f}",
                    f"{cpu:.2f}",
                    f"{rate:.0f}",
                    f"{rate / (n1 / wall1):.1f}",
                    f"{rate / (n_hf / wall_hf):.2f}",
                    f"{n / cpu / (n1 / cpu1):.1f}",
                    f"{n / cpu / (n_hf / cpu_hf):.2f}",
                )
            table.add_row("", f"worst |log-prob - plain forward| (64 in flight): {gap:.1e}")
    Console(width=190).print(table)
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--sizes", default="64x2,256x4", help="model sizes, WIDTHxLAYERS, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case; the fastest counts")
    asyncio.run(main(parser.parse_args()))
