"""Supervised fine-tuning on token sequences with a loss mask: the local backend's one SFT mechanism.

Two callers share it: the warm start of a local RL stage (the paper's Base → SFT → RL shape: the
backbone is fine-tuned on the env's gold demo trajectories before GRPO, see
:mod:`aclarena_slime.local.demos`) and SFT-stage recipes run on the local backend. It trains whatever
parameters of ``model`` require a gradient: all of them for a full fine-tune (:func:`warm_start`), only
the adapter's for a PEFT model.

Loss: the token-mean negative log-likelihood over the mask-1 tokens of a batch. An
:class:`SftExample` masks out the prompt and the observations, exactly as a rollout's loss mask does,
so SFT trains the tokens the policy itself writes and nothing else.

API::

    examples = [SftExample(tokens=[...], loss_mask=[0, 0, 1, 1, ...]), ...]
    report = train_sft(model, examples, SftSettings(steps=200, lr=1e-3), pad_id=0, seed=0)
    backbone_dir, report = warm_start(model_dir, examples, settings, out_dir)   # full fine-tune, saved
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


class SftError(ValueError):
    """SFT data or settings that cannot work; the message says which."""


@dataclass(frozen=True)
class SftExample:
    """One training sequence: ``tokens`` and a 0/1 ``loss_mask`` of the same length (1: trained on).

    The first token is never trained on (nothing predicts it), so its mask must be 0.
    """

    tokens: list[int]
    loss_mask: list[int]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.loss_mask):
            raise SftError(f"tokens ({len(self.tokens)}) and loss_mask ({len(self.loss_mask)}) differ in length")
        if not self.tokens or self.loss_mask[0] != 0:
            raise SftError("an SFT example needs tokens, and its first token cannot be trained on (mask 0)")
        if not any(self.loss_mask):
            raise SftError("an SFT example must train on at least one token (loss_mask has no 1)")

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass(frozen=True)
class SftSettings:
    """``steps`` optimiser steps of ``batch_size`` examples each (seeded epochs over the examples)."""

    steps: int = 100
    batch_size: int = 16
    lr: float = 1e-3
    micro_batch_size: int = 16
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "micro_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SftError(f"{name} must be a positive integer, got {value!r}")
        if self.lr <= 0:
            raise SftError(f"lr must be positive, got {self.lr!r}")


def masked_nll(model: Any, batch: Sequence[SftExample], pad_id: int) -> tuple[torch.Tensor, int]:
    """Summed NLL of the mask-1 tokens of ``batch`` (right-padded into one forward) and their count."""
    longest = max(len(e.tokens) for e in batch)
    ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), longest), dtype=torch.long)
    mask = torch.zeros((len(batch), longest))
    for i, e in enumerate(batch):
        ids[i, : len(e.tokens)] = torch.tensor(e.tokens)
        attention[i, : len(e.tokens)] = 1
        mask[i, : len(e.tokens)] = torch.tensor(e.loss_mask, dtype=torch.float32)
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    # The logits at position p predict token p + 1.
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    target_mask = mask[:, 1:]
    return (nll * target_mask).sum(), int(target_mask.sum())


def mean_nll(model: Any, examples: Sequence[SftExample], pad_id: int, micro_batch_size: int = 16) -> float:
    """Per-token NLL of the trained tokens of ``examples`` (no gradient): what SFT lowers."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(examples), micro_batch_size):
            loss, n = masked_nll(model, examples[start : start + micro_batch_size], pad_id)
            total, count = total + float(loss), count + n
    model.train(was_training)
    return total / max(count, 1)


def sft_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    batch: Sequence[SftExample],
    pad_id: int,
    micro_batch_size: int = 16,
    max_grad_norm: float = 1.0,
) -> dict[str, float]:
    """One optimiser step on the token-mean NLL of ``batch``; returns the loss, tokens and grad norm."""
    if not batch:
        raise SftError("an SFT step needs at least one example")
    n_tokens = sum(e.trained_tokens for e in batch)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for start in range(0, len(batch), micro_batch_size):
        loss, _ = masked_nll(model, batch[start : start + micro_batch_size], pad_id)
        (loss / n_tokens).backward()  # micro-batches add up to the token mean of the whole batch
        loss_sum += float(loss.detach())
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    model.eval()
    return {"loss": loss_sum / n_tokens, "tokens": float(n_tokens), "grad_norm": float(grad_norm)}


def train_sft(
    model: Any, examples: Sequence[SftExample], settings: SftSettings, pad_id: int, seed: int = 0
) -> dict[str, Any]:
    """``settings.steps`` SFT steps on the parameters of ``model`` that require a gradient.

    Returns the per-token NLL of ``examples`` before and after, the mean loss of the first and last
    tenth of the steps, and the seconds taken.
    """
    if not examples:
        raise SftError("no SFT examples (did every demo trajectory fail the reward filter?)")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise SftError("the model has no trainable parameters")
    started = time.monotonic()
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    nll_before = mean_nll(model, examples, pad_id, settings.micro_batch_size)
    rng = random.Random(seed)
    order: list[SftExample] = []
    losses: list[float] = []
    for _ in range(settings.steps):
        if len(order) < settings.batch_size:  # a fresh seeded epoch order when the current one runs out
            order += rng.sample(list(examples), len(examples))
        batch, order = order[: settings.batch_size], order[settings.batch_size :]
        stats = sft_step(model, optimizer, batch, pad_id, settings.micro_batch_size, settings.max_grad_norm)
        losses.append(stats["loss"])
    tenth = max(1, len(losses) // 10)
    return {
        "examples": len(examples),
        "trained_tokens": sum(e.trained_tokens for e in examples),
        "steps": settings.steps,
        "nll_before": nll_before,
        "nll_after": mean_nll(model, examples, pad_id, settings.micro_batch_size),
        "loss_first": sum(losses[:tenth]) / tenth,
        "loss_last": sum(losses[-tenth:]) / tenth,
        "seconds": round(time.monotonic() - started, 2),
    }


def warm_start(
    model_dir: str | Path, examples: Sequence[SftExample], settings: SftSettings, out_dir: str | Path, seed: int = 0
) -> tuple[Path, dict[str, Any]]:
    """Full fine-tune of the model in ``model_dir`` on ``examples``; saved (with its tokenizer) to ``out_dir``.

    The result is a Hugging Face model folder, a new backbone for the RL stage's LoRA expert.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    report = train_sft(model, examples, settings, int(pad or 0), seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out.resolve(), report
