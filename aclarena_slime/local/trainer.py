"""The local policy-gradient step: GRPO advantages, PPO-clipped loss, on one LoRA adapter only.

The trainer holds its own copy of the model (as slime's Megatron actor does, apart from SGLang) with a
trainable PEFT adapter on the frozen backbone. After each step the adapter is exported as a PEFT
directory and the engine reloads it (unload + load), the same sync as on the real backend.

Loss, per response token ``t`` with loss mask 1 (observation tokens have mask 0 and count nowhere)::

    ratio_t = exp(logp_new_t - logp_rollout_t)
    loss_t  = -min(ratio_t * A, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A)

averaged over all loss-mask tokens of the step (DAPO's token-level mean). ``A`` is the sample's
group-normalised reward (GRPO). ``logp_rollout`` are the engine's log-probs, so the first pass of a
step must reproduce them: ``logprob_mismatch`` in the metrics says how closely it does.
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

from aclarena_slime.local.generation import token_log_probs


@dataclass(frozen=True)
class TrainSample:
    """One rollout as the trainer sees it: plain values pulled out of a slime-style sample."""

    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float]
    reward: float
    group: int


@dataclass(frozen=True)
class TrainSettings:
    lr: float = 1e-3
    temperature: float = 1.0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    updates_per_step: int = 1
    micro_batch_size: int = 8
    max_grad_norm: float = 1.0


def grpo_advantages(rewards: Sequence[float], groups: Sequence[int], eps: float = 1e-6) -> list[float]:
    """Each reward minus its group's mean, over the group's standard deviation (0 for a uniform group)."""
    by_group: dict[int, list[float]] = {}
    for r, g in zip(rewards, groups, strict=True):
        by_group.setdefault(g, []).append(float(r))
    stats = {}
    for g, values in by_group.items():
        t = torch.tensor(values, dtype=torch.float64)
        stats[g] = (float(t.mean()), float(t.std(unbiased=False)) if len(values) > 1 else 0.0)
    return [(float(r) - stats[g][0]) / (stats[g][1] + eps) for r, g in zip(rewards, groups, strict=True)]


def ppo_clipped_loss(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of per-token clipped losses over ``mask`` and the number of clipped tokens (all shapes [B, T])."""
    ratio = torch.exp(new_log_probs - old_log_probs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    was_clipped = (clipped < unclipped).float()
    return (per_token * mask).sum(), (was_clipped * mask).sum()


class LoraTrainer:
    """A frozen causal LM plus one trainable LoRA adapter, an optimiser, and the PEFT export."""

    def __init__(self, peft_model: Any, settings: TrainSettings, pad_id: int = 0) -> None:
        self.model = peft_model
        self.settings = settings
        self.pad_id = pad_id
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable (LoRA) parameters")
        self.optimizer = torch.optim.AdamW(self.params, lr=settings.lr, weight_decay=0.0)

    @classmethod
    def build(
        cls,
        model_dir: str | Path,
        settings: TrainSettings,
        *,
        rank: int,
        alpha: float,
        dropout: float,
        target_modules: Sequence[str],
        base_adapter: str | Path | None = None,
        seed: int = 0,
    ) -> LoraTrainer:
        """Load the backbone and add a fresh adapter (or continue ``base_adapter``, a PEFT directory)."""
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if base_adapter is not None:
            model = PeftModel.from_pretrained(base, str(base_adapter), is_trainable=True)
        else:
            config = LoraConfig(
                r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules), bias="none"
            )
            model = get_peft_model(base, config)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        return cls(model, settings, pad_id=int(pad or 0))

    def step(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One policy-gradient step on the step's rollouts; returns what happened, as plain numbers."""
        usable = [s for s in samples if s.response_length > 0 and sum(s.loss_mask) > 0]
        advantages = grpo_advantages([s.reward for s in usable], [s.group for s in usable])
        n_tokens = sum(sum(s.loss_mask) for s in usable)
        out = {"samples": float(len(usable)), "loss_tokens": float(n_tokens), "loss": 0.0, "clip_frac": 0.0}
        out["nonzero_adv_frac"] = sum(abs(a) > 1e-8 for a in advantages) / len(usable) if usable else 0.0
        if not usable:
            out["skipped"] = 1.0
            return out
        if out["nonzero_adv_frac"] == 0.0:  # nothing to learn from: every group had one reward
            with torch.no_grad():
                out["logprob_mismatch"] = self._mismatch(usable, advantages) / n_tokens
            out["skipped"] = 1.0
            return out
        self.model.train()
        mismatch = 0.0
        for update in range(self.settings.updates_per_step):
            self.optimizer.zero_grad(set_to_none=True)
            loss_sum = clipped_sum = diff_sum = 0.0
            size = self.settings.micro_batch_size
            for start in range(0, len(usable), size):
                batch, adv = usable[start : start + size], advantages[start : start + size]
                new_lp, old_lp, mask, adv_t = self._batch_log_probs(batch, adv)
                loss, clipped = ppo_clipped_loss(
                    new_lp, old_lp, adv_t, mask, self.settings.clip_eps_low, self.settings.clip_eps_high
                )
                (loss / n_tokens).backward()
                loss_sum += float(loss.detach())
                clipped_sum += float(clipped)
                diff_sum += float(((new_lp.detach() - old_lp).abs() * mask).sum())
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.settings.max_grad_norm)
            self.optimizer.step()
            if update == 0:
                mismatch = diff_sum / n_tokens
                out["grad_norm"] = float(grad_norm)
            out["loss"], out["clip_frac"] = loss_sum / n_tokens, clipped_sum / n_tokens
        out["logprob_mismatch"] = mismatch
        self.model.eval()
        return out

    def _mismatch(self, samples: Sequence[TrainSample], advantages: Sequence[float]) -> float:
        """Summed |current - rollout| log-prob over loss-mask tokens: ~0 when the plumbing is right."""
        total = 0.0
        size = self.settings.micro_batch_size
        for start in range(0, len(samples), size):
            new, old, mask, _ = self._batch_log_probs(samples[start : start + size], advantages[start : start + size])
            total += float(((new - old).abs() * mask).sum())
        return total

    def _batch_log_probs(
        self, batch: Sequence[TrainSample], advantages: Sequence[float]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Current log-probs of each response token, with the rollout's, the mask and the advantages."""
        longest = max(len(s.tokens) for s in batch)
        width = max(s.response_length for s in batch)
        ids = torch.full((len(batch), longest), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), longest), dtype=torch.long)
        old = torch.zeros((len(batch), width))
        mask = torch.zeros((len(batch), width))
        targets = torch.zeros((len(batch), width), dtype=torch.long)
        for i, s in enumerate(batch):
            ids[i, : len(s.tokens)] = torch.tensor(s.tokens)
            attention[i, : len(s.tokens)] = 1
            r = s.response_length
            targets[i, :r] = torch.tensor(s.tokens[len(s.tokens) - r :])
            old[i, :r] = torch.tensor(s.rollout_log_probs, dtype=torch.float32)
            mask[i, :r] = torch.tensor(s.loss_mask, dtype=torch.float32)
        logits = self.model(input_ids=ids, attention_mask=attention).logits
        # The logits at position p predict token p + 1: gather each sample's response window.
        rows = []
        for i, s in enumerate(batch):
            start = len(s.tokens) - s.response_length - 1
            window = logits[i, start : start + width]
            if window.shape[0] < width:  # shorter sample: pad the window (masked out anyway)
                window = torch.cat([window, window.new_zeros(width - window.shape[0], window.shape[1])])
            rows.append(window)
        new = token_log_probs(torch.stack(rows), targets, self.settings.temperature)
        adv = torch.tensor(advantages, dtype=torch.float32).unsqueeze(1).expand(-1, width)
        return new, old, mask, adv

    def save(self, directory: str | Path) -> Path:
        """Export the adapter as a PEFT directory, replacing ``directory`` atomically (never half-written)."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = directory.parent / f".{directory.name}.staging-{uuid.uuid4().hex[:8]}"
        self.model.save_pretrained(str(staging))
        if directory.exists():
            retired = directory.parent / f".{directory.name}.retired-{uuid.uuid4().hex[:8]}"
            os.replace(directory, retired)
            os.replace(staging, directory)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, directory)
        return directory
