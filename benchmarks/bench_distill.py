"""Distillation data paths: SDFT mixture building, balanced batch drawing, MOPD teacher-answer parsing.

    .venv/bin/python benchmarks/bench_distill.py [--episodes 20000] [--pool 100000]

Prints a table. The SDFT row reads a synthetic slime rollout dump (``torch.load``), filters, converts,
de-duplicates and writes the JSONL mixture (4-message conversations, half of them with a tool turn).
The data-source row draws 128-prompt batches (× 8 samples per prompt) from a 4-domain pool. The MOPD row
checks and extracts teacher log-probs from an SGLang answer for a 16k-token response (the paper's math
response budget), which runs once per sample inside slime's reward step.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from rich.console import Console
from rich.table import Table

from aclarena_slime.distill.balanced_source import BalancedDataSource
from aclarena_slime.distill.dumps import read_dump
from aclarena_slime.distill.mopd import response_log_probs
from aclarena_slime.distill.sdft import MixtureSettings, build_mixture, write_mixture
from aclarena_slime.testing.samples import FakeSample

DOMAINS = ("math", "search", "retail", "ifeval")


def _sample(i: int) -> dict:
    domain = DOMAINS[i % 4]
    messages = [{"role": "user", "content": f"question {i // 3} " + "context " * 40}]
    if i % 2:
        messages += [
            {"role": "assistant", "content": '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'},
            {"role": "tool", "content": "result " * 30},
        ]
    messages.append({"role": "assistant", "content": f"answer {i % 5} " + "reasoning " * 60})
    record = {"messages": messages, "score": {"reward": float(i % 3 != 0), "breakdown": {}}}
    return {"status": "completed", "reward": record["score"]["reward"], "metadata": {"env": domain, "aclarena": record}}


def sdft_rate(n: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "0.pt"
        torch.save({"rollout_id": 0, "samples": [_sample(i) for i in range(n)]}, dump)
        start = time.perf_counter()
        records, _ = build_mixture(read_dump(dump), MixtureSettings(default_threshold=1.0))
        write_mixture(records, Path(tmp) / "mix.jsonl")
        return n / (time.perf_counter() - start), len(records)


def source_rate(pool: int, batches: int = 50) -> float:
    samples = [FakeSample(prompt=f"p{i}", metadata={"domain": DOMAINS[i % 4]}) for i in range(pool)]
    args = SimpleNamespace(n_samples_per_prompt=8, rollout_shuffle=True, rollout_seed=1, save=None, load=None)
    source = BalancedDataSource(args, samples=samples)
    start = time.perf_counter()
    for _ in range(batches):
        source.get_samples(128)
    return batches / (time.perf_counter() - start)


def parse_rate(response: int = 16384, prompt: int = 512, repeats: int = 20) -> float:
    tokens = [i % 1000 for i in range(prompt + response)]
    entries = [[None, tokens[prompt - 1], None]] + [[-0.5, t, None] for t in tokens[prompt:]]
    answer = {"meta_info": {"input_token_logprobs": entries}}
    start = time.perf_counter()
    for _ in range(repeats):
        response_log_probs(answer, tokens, response)
    return (time.perf_counter() - start) / repeats * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20000)
    parser.add_argument("--pool", type=int, default=100000)
    opts = parser.parse_args()
    rate, kept = sdft_rate(opts.episodes)
    table = Table(title="distillation data paths")
    table.add_column("what")
    table.add_column("figure", justify="right")
    table.add_row(
        f"SDFT mixture: read dump → filter → dedupe → write ({opts.episodes} episodes, {kept} kept)",
        f"{rate:,.0f} episodes/s",
    )
    table.add_row(
        f"balanced source: 128 prompts × 8 from a {opts.pool:,}-record pool", f"{source_rate(opts.pool):,.0f} batches/s"
    )
    table.add_row("MOPD: teacher log-probs of a 16k-token response, checked", f"{parse_rate():.2f} ms/sample")
    Console().print(table)


if __name__ == "__main__":
    main()
