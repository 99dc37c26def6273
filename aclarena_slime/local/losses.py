"""The local policy loss by name, as slime computes it from the recipe's ``algorithm`` section.

slime's ``policy_loss_function`` (``slime/backends/megatron_utils/loss.py``) and ``loss_function`` (its
scaling), on the per-token tensors of a batch of samples ([B, T], ``mask`` 1 on the tokens the policy wrote):

- **advantage estimator** (``algorithm.advantage_estimator``): ``grpo`` takes a per-token ratio
  ``exp(logp_new - logp_old)``; ``gspo`` a sequence-level one, ``exp`` of the sample's mean log-ratio over its
  loss-mask tokens (``compute_gspo_kl``), shared by its tokens. Both take the group-normalised reward as every
  token's advantage (slime's ``_post_process_rewards`` and ``get_grpo_returns``: :func:`advantages`).
- the PPO clip ``-min(r A, clip(r, 1 - eps_clip, 1 + eps_clip_high) A)`` per token (``compute_policy_loss``),
  plus ``kl_loss_coef`` times slime's KL estimate to the reference (:func:`aclarena_slime.kl.approx_kl`) with
  ``use_kl_loss``.
- **aggregation** (``algorithm.extra.calculate_per_token_loss``): by default each sample's token mean, summed,
  over the optimiser step's samples (``sum_of_sample_mean``; ``loss_function`` divides by the step's global
  batch); with it the token sum over the step's loss-mask tokens (DAPO's token-level mean).

:func:`policy_loss` returns the step's numerators (a micro-batch's part of them); :func:`denominator` is what
the optimiser step divides them by, so micro-batches add up to slime's loss and gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from aclarena_slime.group_rewards import GroupNormalization, normalized_rewards
from aclarena_slime.kl import approx_kl
from aclarena_slime.local.parts import LossSettings


@dataclass(frozen=True)
class LossTerms:
    """A batch's loss and its parts, each as the step's numerator (see :func:`denominator`)."""

    loss: torch.Tensor  # what is backpropagated: pg_loss + kl.coef * kl
    pg_loss: torch.Tensor
    clipped: torch.Tensor  # the share of clipped tokens, aggregated as the loss is
    kl: torch.Tensor


def advantages(estimator: str, rewards: Sequence[float], groups: Sequence[int]) -> list[float]:
    """Each sample's advantage: its reward minus its group's mean, over the group's n-1 standard deviation
    (0 for a uniform group), for ``grpo`` and ``gspo`` alike (:mod:`aclarena_slime.group_rewards`)."""
    samples = [SimpleNamespace(group_index=g, remove_sample=False) for g in groups]
    return normalized_rewards(samples, [float(r) for r in rewards], GroupNormalization(estimator))


def aggregate(values: torch.Tensor, mask: torch.Tensor, per_token: bool) -> torch.Tensor:
    """slime's reducer over a batch ([B, T]): the sum of each sample's mask-mean (``sum_of_sample_mean``), or
    with ``per_token`` the mask-sum over every token."""
    if per_token:
        return (values * mask).sum()
    return ((values * mask).sum(-1) / mask.sum(-1).clamp_min(1)).sum()


def denominator(masks: Sequence[Sequence[int]], per_token: bool) -> int:
    """What an optimiser step divides its samples' :func:`aggregate` by: their number (slime's global batch), or
    with ``per_token`` their loss-mask tokens."""
    if per_token:
        return sum(max(sum(m), 1) for m in masks)
    return len(masks)


def policy_loss(
    new_log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    ref_log_probs: torch.Tensor | None = None,
) -> LossTerms:
    """The batch's clipped policy loss (and KL term, with ``settings.kl``), aggregated as the recipe says.

    ``advantages`` are per token ([B, T], the sample's advantage on each). ``ref_log_probs`` are needed only with
    a KL term."""
    log_ratio = new_log_probs - old_log_probs
    if settings.estimator == "gspo":  # one ratio per sample: its mean log-ratio over its loss-mask tokens
        log_ratio = ((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp_min(1)).expand_as(
            mask
        )
    ratio = log_ratio.exp()
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high) * advantages
    pg_loss = aggregate(torch.maximum(unclipped, clipped), mask, settings.per_token)
    clip_frac = aggregate((clipped > unclipped).float(), mask, settings.per_token)
    kl = torch.zeros(())
    if settings.kl.coef:
        if ref_log_probs is None:
            raise ValueError("a KL term (kl.coef > 0) needs the reference policy's log-probs")
        kl = aggregate(approx_kl(new_log_probs, ref_log_probs, settings.kl.kind), mask, settings.per_token)
    return LossTerms(loss=pg_loss + settings.kl.coef * kl, pg_loss=pg_loss, clipped=clip_frac, kl=kl)
