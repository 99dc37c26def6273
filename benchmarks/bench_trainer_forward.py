"""Seconds of the local trainer's forward over a step's rollouts, by prompt length: right-padded under the causal
mask alone (what the trainer and the SFT step run where no gradient flows: the reference, the parity check, the
measurements; ``aclarena_slime.local.sft.right_padded_logits``) against the same batch with a padding attention
mask (the anchor: a transformers batch as usually written, and what they ran until 2026-12).

    .venv/bin/python benchmarks/bench_trainer_forward.py [--lengths 512,4096,10900] [--batch 4] [--repeat 3]

The model is the tests' tiny Qwen3 (64 wide, 2 layers, 518 tokens; built in-process), the batch ``--batch``
sequences of one prompt length with responses of 24, 20, 16, ... tokens, so every sequence but the longest is
padded. 10,900 tokens is a retail rollout (the authors' policy, tool schemas and first user turn) under the tiny
tokenizer. Each case runs ``--repeat`` times; the table gives the median and the range, and the largest difference
between the two cases' logits at real positions (0: the mask changes nothing there). On this project's 2-core
machine: 1.4x at 512 tokens, 3.0x at 4,096, 4.0x at 10,900 (1.1 s against 4.4 s), difference 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from aclarena_slime.local.sft import right_padded_logits
from aclarena_slime.local.tiny_model import build_tiny_qwen3


def timed(fn, repeat: int) -> tuple[list[float], torch.Tensor]:
    """Seconds of ``repeat`` calls of ``fn`` and its last result."""
    seconds, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - start)
    return seconds, out


def masked_logits(model, sequences: list[list[int]], pad_id: int) -> torch.Tensor:
    """The anchor: the same right-padded batch with a padding attention mask."""
    ids = torch.full((len(sequences), max(map(len, sequences))), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, tokens in enumerate(sequences):
        ids[i, : len(tokens)] = torch.tensor(tokens)
        attention[i, : len(tokens)] = 1
    return model(input_ids=ids, attention_mask=attention).logits


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    model = build_tiny_qwen3(518).eval()
    generator = torch.Generator().manual_seed(0)
    load = os.getloadavg()
    table = Table(title=f"trainer forward, {args.batch} sequences a batch, {args.threads} torch thread(s); "
                        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    for column in ("prompt tokens", "causal only (s)", "range", "padding mask (s)", "range", "x faster", "max |diff|"):
        table.add_column(column, justify="right")
    for length in (int(n) for n in args.lengths.split(",")):
        lengths = [length + 24 - 4 * i for i in range(args.batch)]
        sequences = [torch.randint(1, 518, (n,), generator=generator).tolist() for n in lengths]
        with torch.no_grad():
            ours, causal = timed(lambda: right_padded_logits(model, sequences, 0)[1], args.repeat)  # noqa: B023
            anchor, masked = timed(lambda: masked_logits(model, sequences, 0), args.repeat)  # noqa: B023
        diff = max(float((causal[i, : len(s)] - masked[i, : len(s)]).abs().max()) for i, s in enumerate(sequences))
        mid, mid_anchor = statistics.median(ours), statistics.median(anchor)
        table.add_row(str(length), f"{mid:.2f}", f"{min(ours):.2f}-{max(ours):.2f}", f"{mid_anchor:.2f}",
                      f"{min(anchor):.2f}-{max(anchor):.2f}", f"{mid_anchor / mid:.1f}", f"{diff:.1e}")  # fmt: skip
    Console(width=140).print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,4096,10900", help="prompt lengths in tokens, comma-separated")
    parser.add_argument("--batch", type=int, default=4, help="sequences a batch")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case")
    main(parser.parse_args())
