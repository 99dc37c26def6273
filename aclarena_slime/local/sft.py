"""Supervised fine-tuning on token sequences with a loss mask: the local backend's one SFT mechanism.

Two callers share it: the warm start of a local RL stage (the paper's Base → SFT → RL shape: the
backbone is fine-tuned on the env's gold demo trajectories before GRPO, see
:mod:`aclarena_slime.local.demos`) and SFT-stage recipes run on the local backend. It trains whatever
parameters of ``model`` require a gradient: all of them for a full fine-tune (:func:`warm_start`), only
the adapter's for a PEFT model.

Loss: the token-mean negative log-likelihood over the mask-1 tokens of a batch. An
:class:`SftExample` masks out the prompt and the observations, exactly as a rollout's loss mask does,
so SFT trains the tokens the policy itself writes and nothing else. With a KL term (``kl.coef`` > 0: the KL
anchor acting on a stage's warm start) the loss adds ``kl.coef`` times the token-mean KL of the policy to a frozen
``reference`` (the policy the stage started from) on those tokens, estimated as the GRPO phase does
(:func:`approx_kl` of kind ``kl.kind``, the stage's one KL term).

API::

    examples = [SftExample(tokens=[...], loss_mask=[0, 0, 1, 1, ...]), ...]
    settings = SftSettings(steps=200, batch_size=16, lr=1e-3, backprop=Backprop(16), kl=KlTerm(0.0, "low_var_kl"))
    report = train_sft(model, examples, settings, pad_id=0, seed=0)
    backbone_dir, report = warm_start(model_dir, examples, settings, out_dir)   # full fine-tune, saved
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aclarena_slime.kl import approx_kl
from aclarena_slime.local.parts import Backprop, KlTerm, SftError, SftSettings


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


def masked_nll(model: Any, batch: Sequence[SftExample], pad_id: int) -> tuple[torch.Tensor, int]:
    """Summed NLL of the mask-1 tokens of ``batch`` (right-padded into one forward) and their count."""
    nll, target_mask = token_nll(model, batch, pad_id)
    return (nll * target_mask).sum(), int(target_mask.sum())


def right_padded_logits(
    model: Any, sequences: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequences`` right-padded into one batch, and ``model``'s logits over it.

    A forward without gradients (the reference's, the parity check's, the measurements') runs without an attention
    mask: under the causal mask no real token attends to the padding after it, so each real position's logits are
    what a padding mask gives (identical in float32 on CPU), and attention keeps its causal kernel, 4x as fast on
    four retail rollouts of ~11k tokens (benchmarks/bench_trainer_forward.py). Where gradients flow the padding mask
    stays: the causal kernel's backward rounds differently (1e-6), and the tiny model's training follows its
    rounding, so every published local figure would move.
    """
    ids = torch.full((len(sequences), max(len(s) for s in sequences)), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, tokens in enumerate(sequences):
        ids[i, : len(tokens)] = torch.tensor(tokens)
        attention[i, : len(tokens)] = 1
    if not torch.is_grad_enabled():
        return ids, model(input_ids=ids).logits
    return ids, model(input_ids=ids, attention_mask=attention).logits


def token_nll(model: Any, batch: Sequence[SftExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token NLL of ``batch``'s next tokens (right-padded into one forward) and their 0/1 loss mask."""
    ids, logits = right_padded_logits(model, [e.tokens for e in batch], pad_id)
    mask = torch.zeros(ids.shape)
    for i, e in enumerate(batch):
        mask[i, : len(e.tokens)] = torch.tensor(e.loss_mask, dtype=torch.float32)
    logits = logits[:, :-1].float()
    # The logits at position p predict token p + 1.
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return nll, mask[:, 1:]


def masked_kl(
    model: Any, reference: Any, batch: Sequence[SftExample], pad_id: int, kind: str
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Summed NLL of ``batch``'s mask-1 tokens under ``model``, the summed KL estimate of ``model`` to
    ``reference`` on them (the GRPO phase's estimator; the log-prob of a token is minus its NLL), and their count.
    ``reference``: the reference model, or its NLLs computed once (:class:`ReferenceNll`)."""
    nll, target_mask = token_nll(model, batch, pad_id)
    if isinstance(reference, ReferenceNll):
        ref_nll = reference.padded(batch, nll.detach())
    else:
        with torch.no_grad():
            ref_nll, _ = token_nll(reference, batch, pad_id)
    kl = approx_kl(-nll, -ref_nll, kind)
    return (nll * target_mask).sum(), (kl * target_mask).sum(), int(target_mask.sum())


class ReferenceNll:
    """The frozen reference's per-token NLL of each example, computed once before SFT: the reference does not
    change while SFT runs, so its forward pass need not be repeated for every batch that draws an example
    (with the arena's 200 steps of 16 over 512 examples, six times each)."""

    def __init__(self, reference: Any, examples: Sequence[SftExample], pad_id: int, micro_batch_size: int):
        self.table: dict[tuple[int, ...], torch.Tensor] = {}
        distinct = list({tuple(e.tokens): e for e in examples}.values())
        with torch.no_grad():
            for start in range(0, len(distinct), micro_batch_size):
                micro = distinct[start : start + micro_batch_size]
                nll, _ = token_nll(reference, micro, pad_id)
                for i, e in enumerate(micro):
                    self.table[tuple(e.tokens)] = nll[i, : len(e.tokens) - 1].clone()

    def padded(self, batch: Sequence[SftExample], fill: torch.Tensor) -> torch.Tensor:
        """The batch's reference NLLs in ``fill``'s shape; padding keeps ``fill`` (log ratio 0, no KL there)."""
        out = fill.clone()
        for i, e in enumerate(batch):
            out[i, : len(e.tokens) - 1] = self.table[tuple(e.tokens)]
        return out


def mean_kl(
    model: Any, reference: Any, examples: Sequence[SftExample], pad_id: int, kind: str, micro_batch_size: int
) -> float:
    """Per-token KL estimate of ``model`` to ``reference`` on the trained tokens of ``examples`` (no gradient):
    how far SFT moved the policy from where it started, where it trains."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(examples), micro_batch_size):
            _, kl, n = masked_kl(model, reference, examples[start : start + micro_batch_size], pad_id, kind)
            total, count = total + float(kl), count + n
    model.train(was_training)
    return total / max(count, 1)


def mean_nll(model: Any, examples: Sequence[SftExample], pad_id: int, micro_batch_size: int) -> float:
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
    backprop: Backprop,
    reference: Any = None,
    kl: KlTerm | None = None,
) -> dict[str, float]:
    """One optimiser step on the token-mean NLL of ``batch`` (plus the KL term ``kl`` to ``reference``, where it
    has a coefficient); returns the NLL, tokens and grad norm (and the KL)."""
    if not batch:
        raise SftError("an SFT step needs at least one example")
    anchored = kl is not None and kl.coef > 0
    if anchored and reference is None:
        raise SftError("an SFT step with a KL term needs the reference policy")
    n_tokens = sum(e.trained_tokens for e in batch)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_sum = kl_sum = 0.0
    for start in range(0, len(batch), backprop.micro_batch_size):
        micro = batch[start : start + backprop.micro_batch_size]
        if anchored:
            loss, kl_estimate, _ = masked_kl(model, reference, micro, pad_id, kl.kind)
            kl_sum += float(kl_estimate.detach())
            ((loss + kl.coef * kl_estimate) / n_tokens).backward()
        else:
            loss, _ = masked_nll(model, micro, pad_id)
            (loss / n_tokens).backward()  # micro-batches add up to the token mean of the whole batch
        loss_sum += float(loss.detach())
    grad_norm = torch.nn.utils.clip_grad_norm_(params, backprop.max_grad_norm)
    optimizer.step()
    model.eval()
    out = {"loss": loss_sum / n_tokens, "tokens": float(n_tokens), "grad_norm": float(grad_norm)}
    return {**out, "kl": kl_sum / n_tokens} if anchored else out


def train_sft(
    model: Any,
    examples: Sequence[SftExample],
    settings: SftSettings,
    pad_id: int,
    seed: int = 0,
    reference: Any = None,
) -> dict[str, Any]:
    """``settings.steps`` SFT steps on the parameters of ``model`` that require a gradient.

    Returns the per-token NLL of ``examples`` (the first ``settings.nll_examples``) before and after, the mean
    loss of the first and last tenth of the steps, and the seconds taken. With ``settings.kl.coef`` > 0 the loss
    holds the KL term to ``reference`` (frozen; required then), and the report the KL (``kl_first``/``kl_last``
    per step, ``kl_after`` on all ``examples``).
    """
    if not examples:
        raise SftError("no SFT examples (did every demo trajectory fail the reward filter?)")
    kl, micro = settings.kl, settings.backprop.micro_batch_size
    if kl.coef and reference is None:
        raise SftError("SFT with a KL term needs the reference policy (the stage's start)")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise SftError("the model has no trainable parameters")
    started = time.monotonic()
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    measured = examples[: settings.nll_examples]
    nll_before = mean_nll(model, measured, pad_id, micro)
    rng = random.Random(seed)
    order: list[SftExample] = []
    losses: list[float] = []
    kls: list[float] = []
    if kl.coef:
        reference = ReferenceNll(reference, examples, pad_id, micro)
    for _ in range(settings.steps):
        if len(order) < settings.batch_size:  # a fresh seeded epoch order when the current one runs out
            order += rng.sample(list(examples), len(examples))
        batch, order = order[: settings.batch_size], order[settings.batch_size :]
        stats = sft_step(model, optimizer, batch, pad_id, settings.backprop, reference, kl)
        losses.append(stats["loss"])
        kls += [stats["kl"]] if "kl" in stats else []
    tenth = max(1, len(losses) // 10)
    anchored = {}
    if kl.coef:
        anchored = {
            "kl_coef": kl.coef,
            "kl_loss_type": kl.kind,
            "kl_first": sum(kls[:tenth]) / tenth,
            "kl_last": sum(kls[-tenth:]) / tenth,
            "kl_after": mean_kl(model, reference, examples, pad_id, kl.kind, micro),
        }
    return {
        "examples": len(examples),
        "trained_tokens": sum(e.trained_tokens for e in examples),
        "steps": settings.steps,
        "nll_before": nll_before,
        "nll_examples": len(measured),
        "nll_after": mean_nll(model, measured, pad_id, micro),
        "loss_first": sum(losses[:tenth]) / tenth,
        "loss_last": sum(losses[-tenth:]) / tenth,
        **anchored,
        "seconds": round(time.monotonic() - started, 2),
    }


def warm_start(
    model_dir: str | Path, examples: Sequence[SftExample], settings: SftSettings, out_dir: str | Path, seed: int = 0
) -> tuple[Path, dict[str, Any]]:
    """Full fine-tune of the model in ``model_dir`` on ``examples``; saved (with its tokenizer) to ``out_dir``.

    The result is a Hugging Face model folder, a new backbone for the RL stage's LoRA expert. With
    ``settings.kl.coef`` > 0 the KL term's reference is the model in ``model_dir`` as it was (frozen).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    reference = frozen_copy(model) if settings.kl.coef else None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    report = train_sft(model, examples, settings, int(pad or 0), seed, reference)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out.resolve(), report


def frozen_copy(model: Any) -> Any:
    """A copy of ``model`` in eval mode with no parameter requiring a gradient: a KL reference."""
    reference = copy.deepcopy(model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference
