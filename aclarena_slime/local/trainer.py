"""The local policy-gradient step: the recipe's loss (:mod:`.losses`) on the step's rollouts; LoRA or full fine-tuning.

The trainer holds its own copy of the model (as slime's Megatron actor does, apart from SGLang): a
trainable PEFT adapter on the frozen backbone (the adapter is exported as a PEFT directory and the engine
reloads it, unload + load, the same sync as on the real backend), or with ``lora.enabled=false`` every
parameter (the engine's weights are updated in place after each step).

The loss is slime's, by the recipe's names (:mod:`aclarena_slime.local.losses`): the PPO clip on a per-token
(``grpo``) or sequence-level (``gspo``) ratio, an optional KL term to the reference (the policy the stage
started from; ``algorithm.kl_loss_coef`` > 0 under ``use_kl_loss``), aggregated per sample by default or per token with
``calculate_per_token_loss``. Observation tokens have loss mask 0 and count nowhere. The old log-probs are the
engine's, so the first pass of a step must reproduce them: ``logprob_mismatch`` in the metrics says how
closely it does.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aclarena_slime.kl import approx_kl
from aclarena_slime.local.generation import token_log_probs
from aclarena_slime.local.losses import advantages, denominator, policy_loss
from aclarena_slime.local.parts import TrainSettings
from aclarena_slime.local.sft import SftExample, frozen_copy, right_padded_logits, sft_step
from aclarena_slime.lora.config import LoraConfig


@dataclass(frozen=True)
class TrainSample:
    """One rollout as the trainer sees it: plain values pulled out of a slime-style sample."""

    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float]
    reward: float
    group: int


def advantage_figures(advantages: Sequence[float], groups: Sequence[int]) -> dict[str, float]:
    """Whether a step has anything to learn from: the share of samples with a non-zero advantage, the share of
    groups whose rewards differ (a group of equal rewards, all right or all wrong, has no gradient), and the
    advantages' standard deviation."""
    by_group: dict[int, list[float]] = {}
    for a, g in zip(advantages, groups, strict=True):
        by_group.setdefault(g, []).append(a)
    n = len(advantages)
    mean = sum(advantages) / n if n else 0.0
    return {
        "nonzero_adv_frac": sum(abs(a) > 1e-8 for a in advantages) / n if n else 0.0,
        "groups_with_spread": sum(any(abs(a) > 1e-8 for a in g) for g in by_group.values()) / max(len(by_group), 1),
        "adv_std": (sum((a - mean) ** 2 for a in advantages) / n) ** 0.5 if n else 0.0,
    }


def _tokens(samples: Sequence[TrainSample]) -> int:
    """The loss-mask tokens of ``samples``: what a step's token mean divides by."""
    return sum(sum(s.loss_mask) for s in samples)


def contiguous_parts(n: int, parts: int) -> list[tuple[int, int]]:
    """``n`` samples split in order into ``parts`` (start, end) ranges as even as they go (slime's steps of
    ``global_batch_size`` samples when ``n`` is the whole rollout; the GRPO step's and the SFT stage's optimiser
    steps); fewer when there are fewer samples."""
    parts = max(1, min(parts, n))
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _pass_sums(
    new: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Mask-summed |policy - rollout| log-prob, entropy, and KL (k3, non-negative) of the policy to the start."""
    return {
        "logprob_mismatch": float(((new - old).abs() * mask).sum()),
        "entropy": float((entropy * mask).sum()),
        "kl_to_start": float((approx_kl(new, ref, "k3") * mask).sum()),
    }


class PolicyTrainer:
    """The policy a local stage trains, its optimiser, its KL reference and its export.

    Two kinds, as the recipe's ``lora.enabled`` says: a LoRA expert on a frozen backbone (the adapter is
    exported as a PEFT directory and the engine reloads it), or full fine-tuning (every parameter; the
    engine's weights are updated in place after each step, ``LocalEngine.update_weights``).
    """

    def __init__(
        self,
        model: Any,
        settings: TrainSettings,
        pad_id: int = 0,
        full: bool = False,
        tokenizer: Any = None,
        reference: Any = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer  # saved beside a fully fine-tuned model
        self.settings = settings
        self.pad_id = pad_id
        self.full = full
        if full:
            for p in self.model.parameters():
                p.requires_grad_(True)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=settings.lr, betas=settings.adam_betas, weight_decay=settings.weight_decay
        )
        # The policy the stage starts from, frozen: the KL term's reference, and what ``kl_to_start`` measures
        # the policy against every step; a given one is shared (experts on one backbone:
        # :mod:`aclarena_slime.local.parallel_mle`).
        self.reference = frozen_copy(self.model) if reference is None else reference

    @classmethod
    def build(
        cls,
        model_dir: str | Path,
        settings: TrainSettings,
        lora: LoraConfig | None,
        base_adapter: str | Path | None = None,
        seed: int = 0,
    ) -> PolicyTrainer:
        """Load the backbone; add a fresh adapter (or continue ``base_adapter``), or with ``lora`` None train
        every parameter."""
        from peft import PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if lora is None:
            if base_adapter is not None:
                raise ValueError("full fine-tuning continues a model folder, not an adapter (base_adapter is set)")
        elif base_adapter is not None:
            model = PeftModel.from_pretrained(model, str(base_adapter), is_trainable=True)
        else:
            model = get_peft_model(model, peft_lora_config(lora))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(model, settings, pad_id=int(pad or 0), full=lora is None, tokenizer=tokenizer)

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One policy-gradient step on the step's rollouts; returns what happened, as plain numbers.

        The rollouts' advantages are computed over the whole step; the samples are then split, in order, into
        ``minibatches`` contiguous parts, one optimiser step each (slime's ``num_steps_per_rollout``: a step of
        ``global_batch_size`` samples; after the first, the policy is off its rollouts and the clip can engage).
        Besides the loss, the diagnostics of why a step does or does not learn (:func:`advantage_figures`, and
        from the pass of the first optimiser step, before it updates: the policy's token entropy and its KL to the
        starting policy, ``entropy`` and ``kl_to_start``, and its ``grad_norm``; ``clip_frac`` and ``loss`` of the
        last). A part whose groups all score alike trains nothing and is skipped (``updates``: the optimiser steps
        taken).
        """
        usable = [s for s in samples if s.response_length > 0 and sum(s.loss_mask) > 0]
        adv_all = advantages(self.settings.loss.estimator, [s.reward for s in usable], [s.group for s in usable])
        out = {"samples": float(len(usable)), "loss_tokens": float(_tokens(usable)), "loss": 0.0, "clip_frac": 0.0}
        out.update(advantage_figures(adv_all, [s.group for s in usable]))
        out["updates"] = 0.0
        if not usable:
            out["skipped"] = 1.0
            return out
        parts = contiguous_parts(len(usable), self.settings.minibatches)
        for epoch in range(self.settings.updates_per_step):
            for part, (start, end) in enumerate(parts):
                batch, adv = usable[start:end], adv_all[start:end]
                first = epoch == 0 and part == 0
                if not self.settings.loss.kl.coef and not any(abs(a) > 1e-8 for a in adv):  # one reward per group
                    if first:
                        with torch.no_grad():
                            out.update(self._measure(batch, adv, _tokens(batch)))
                    continue
                self.model.train()
                out.update(self._update(batch, adv, measure=first))
                out["updates"] += 1.0
        if out["updates"]:
            self.model.eval()
        else:
            out["skipped"] = 1.0
        return out

    def _update(self, batch: Sequence[TrainSample], advantages: Sequence[float], measure: bool) -> dict[str, float]:
        """One optimiser step on ``batch``'s loss, aggregated as the recipe says (:mod:`.losses`: per sample or
        per token); with ``measure``, the pass's figures before the update (log-prob mismatch, entropy, KL to the
        start, token means) and the grad norm too."""
        loss_settings = self.settings.loss
        n_tokens = _tokens(batch)
        per_step = denominator([s.loss_mask for s in batch], loss_settings.per_token)
        size = self.settings.backprop.micro_batch_size
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = clipped_sum = kl_sum = 0.0
        before = {"logprob_mismatch": 0.0, "entropy": 0.0, "kl_to_start": 0.0}
        for start in range(0, len(batch), size):
            micro, adv = batch[start : start + size], advantages[start : start + size]
            new_lp, old_lp, mask, adv_t, entropy = self._batch_log_probs(micro, adv)
            ref_lp = None
            if loss_settings.kl.coef or measure:
                with torch.no_grad():
                    ref_lp = self._batch_log_probs(micro, adv, self.reference)[0]
            terms = policy_loss(new_lp, old_lp, adv_t, mask, loss_settings, ref_lp)
            (terms.loss / per_step).backward()  # micro-batches add up to the optimiser step's loss
            loss_sum += float(terms.loss.detach())
            clipped_sum += float(terms.clipped)
            kl_sum += float(terms.kl.detach())
            if measure:
                for key, value in _pass_sums(new_lp.detach(), old_lp, ref_lp, entropy, mask).items():
                    before[key] += value
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.settings.backprop.max_grad_norm)
        self.optimizer.step()
        out = {"loss": loss_sum / per_step, "clip_frac": clipped_sum / per_step}
        if measure:
            out.update({key: value / n_tokens for key, value in before.items()}, grad_norm=float(grad_norm))
        if loss_settings.kl.coef:
            out["kl"] = kl_sum / per_step
        return out

    def sft_step(self, examples: Sequence[SftExample]) -> dict[str, float]:
        """One optimiser step of the shared SFT loss (:func:`aclarena_slime.local.sft.sft_step`) on this policy."""
        return sft_step(self.model, self.optimizer, examples, self.pad_id, self.settings.backprop)

    @torch.no_grad()
    def recompute_log_probs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """The policy's log-probs of each sample's response tokens, as the loss sees them (the parity check's
        trainer side, :mod:`aclarena_slime.parity`)."""
        out: list[list[float]] = []
        size = self.settings.backprop.micro_batch_size
        for start in range(0, len(samples), size):
            batch = samples[start : start + size]
            new = self._batch_log_probs(batch, [0.0] * len(batch))[0]
            out += [new[i, : s.response_length].tolist() for i, s in enumerate(batch)]
        return out

    def _measure(self, samples: Sequence[TrainSample], advantages: Sequence[float], n_tokens: int) -> dict[str, float]:
        """The pass-before-update figures of a step that trains nothing: log-prob mismatch (|current - rollout|,
        ~0 when the plumbing is right), entropy and KL to the starting policy, token means."""
        sums = {"logprob_mismatch": 0.0, "entropy": 0.0, "kl_to_start": 0.0}
        size = self.settings.backprop.micro_batch_size
        for start in range(0, len(samples), size):
            batch, adv = samples[start : start + size], advantages[start : start + size]
            new, old, mask, _, entropy = self._batch_log_probs(batch, adv)
            ref = self._batch_log_probs(batch, adv, self.reference)[0]
            for key, value in _pass_sums(new, old, ref, entropy, mask).items():
                sums[key] += value
        return {key: value / n_tokens for key, value in sums.items()}

    def _batch_log_probs(
        self, batch: Sequence[TrainSample], advantages: Sequence[float], model: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs of each response token under ``model`` (the policy unless given), with the rollout's,
        the mask, the advantages and the token entropy (no gradient) of the sampling distribution."""
        width = max(s.response_length for s in batch)
        old = torch.zeros((len(batch), width))
        mask = torch.zeros((len(batch), width))
        targets = torch.zeros((len(batch), width), dtype=torch.long)
        for i, s in enumerate(batch):
            r = s.response_length
            targets[i, :r] = torch.tensor(s.tokens[len(s.tokens) - r :])
            old[i, :r] = torch.tensor(s.rollout_log_probs, dtype=torch.float32)
            mask[i, :r] = torch.tensor(s.loss_mask, dtype=torch.float32)
        _, logits = right_padded_logits(model or self.model, [s.tokens for s in batch], self.pad_id)
        # The logits at position p predict token p + 1: gather each sample's response window.
        rows = []
        for i, s in enumerate(batch):
            start = len(s.tokens) - s.response_length - 1
            window = logits[i, start : start + width]
            if window.shape[0] < width:  # shorter sample: pad the window (masked out anyway)
                window = torch.cat([window, window.new_zeros(width - window.shape[0], window.shape[1])])
            rows.append(window)
        windows = torch.stack(rows)
        new = token_log_probs(windows, targets, self.settings.rollouts.temperature)
        adv = torch.tensor(advantages, dtype=torch.float32).unsqueeze(1).expand(-1, width)
        with torch.no_grad():
            log_p = torch.log_softmax(windows.detach().float() / self.settings.rollouts.temperature, dim=-1)
            entropy = -(log_p.exp() * log_p).sum(-1)
        return new, old, mask, adv, entropy

    def save(self, directory: str | Path) -> Path:
        """Export the policy, replacing ``directory`` atomically (never half-written): the adapter as a PEFT
        directory, or with full fine-tuning the model as a Hugging Face folder (with its tokenizer)."""
        directory = Path(directory)
        staging = staging_folder(directory)
        self.model.save_pretrained(str(staging))
        if self.full and self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(staging))
        publish_folder(staging, directory)
        return directory


def staging_folder(directory: Path) -> Path:
    """A fresh sibling of ``directory`` to write its next version into (see :func:`publish_folder`), once
    what killed saves of it left is cleared (:func:`clear_leftovers`)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    clear_leftovers(directory)
    return directory.parent / f".{directory.name}.staging-{uuid.uuid4().hex[:8]}"


def clear_leftovers(directory: Path) -> None:
    """Remove the ``.staging-*`` and ``.retired-*`` siblings of ``directory`` that killed saves left; one
    killed between :func:`publish_folder`'s two renames left ``directory`` missing and its last version
    retired: that version is put back first."""
    retired = sorted(directory.parent.glob(f".{directory.name}.retired-*"), key=lambda p: p.stat().st_mtime)
    if retired and not directory.exists():
        os.replace(retired.pop(), directory)
    for leftover in [*retired, *directory.parent.glob(f".{directory.name}.staging-*")]:
        shutil.rmtree(leftover, ignore_errors=True)


def publish_folder(written: Path, directory: Path) -> None:
    """Put the fully written folder ``written`` in place of ``directory`` by renames: a reader (the engine
    loading an adapter, a resumed run) finds the old folder or the new one, never a half-written one."""
    if directory.exists():
        retired = directory.parent / f".{directory.name}.retired-{uuid.uuid4().hex[:8]}"
        os.replace(directory, retired)
        os.replace(written, directory)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(written, directory)


def peft_lora_config(lora: LoraConfig) -> Any:
    """The recipe's LoRA settings as PEFT's config (Megatron module names translated): a fresh expert's."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.hf_target_modules()),
        bias="none",
    )
