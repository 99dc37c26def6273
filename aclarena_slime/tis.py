"""Train/inference mismatch correction as the authors' full-fine-tuning runs apply it (their "MIS" variant of TIS).

Slime computes the policy loss with the training engine's log-probs while the tokens were sampled by
SGLang; the two disagree a little. With ``--use-tis`` slime calls a function (``--custom-tis-function-path``, the ``tis`` hook of
:mod:`aclarena_slime.slime_edge`, which calls :func:`correction`) that reweights and masks the per-token loss.
Per response token, with ``r = exp(log p_train - log p_rollout)``:

- **weight**: ``min(r, cap)`` (token-level truncated importance sampling);
- **rejected** (loss mask 0): tokens with ``r`` outside ``[reject_below, reject_above]``;
- **veto**: a sequence with any token ``r < veto_below`` is rejected whole;
- **batch normalisation**: weights divided by their mean over the batch's loss-mask tokens, so they average 1.

The authors' settings (WillDreamer/ACLArena ``slime/examples/train_infer_mismatch_helper/mis.yaml:1-40``,
identical in ``mis_8b.yaml``; the search run ``run_qwen3_8b_seq_search.sh:246-247`` and the retail run
``tau-bench/run_qwen3_8B.sh:155-156`` use them): token level, truncate at 2.0, reject outside
[0.5, 2.0], veto below 1e-4, batch-normalised. These are the defaults; ``aclarena_tis`` in the custom
config (``{cap, reject_below, reject_above, veto_below, batch_normalize}``) changes them. Their LoRA
runs leave TIS off (``tau-bench/run_qwen3_8B_lora.sh:438-473``), and so do our LoRA recipes.

Observation tokens (loss mask 0, log-prob 0.0 from our rollout) never enter a weight, a rejection, the
veto or the normaliser: everything is taken over loss-mask tokens only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where the correction runs: the recipe schema reads TisSettings
    import torch

LOG_RATIO_BOUND = 20.0  # exp() of a larger log-ratio overflows in bf16/fp16 and means nothing anyway


class TisConfigError(ValueError):
    pass


@dataclass
class TisSettings:
    cap: float = 2.0
    reject_below: float | None = 0.5
    reject_above: float | None = 2.0
    veto_below: float | None = 1e-4
    batch_normalize: bool = True

    def __post_init__(self) -> None:
        if not self.cap > 0:
            raise TisConfigError(f"aclarena_tis.cap must be positive, got {self.cap}")
        low, high = self.reject_below, self.reject_above
        if low is not None and high is not None and not 0 <= low < high:
            raise TisConfigError(f"aclarena_tis: need 0 <= reject_below < reject_above, got [{low}, {high}]")
        if self.veto_below is not None and not 0 < self.veto_below < 1:
            raise TisConfigError(f"aclarena_tis.veto_below must be in (0, 1), got {self.veto_below}")


def correction(
    train_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    settings: TisSettings,
) -> tuple[list[torch.Tensor], list[torch.Tensor], dict[str, list[torch.Tensor]]]:
    """Per sequence (whole responses): the loss weights, the masks after rejection, per-token metrics.

    Weights and masks are detached: the correction scales the gradient, it is not differentiated.
    """
    import torch

    if not len(train_log_probs) == len(rollout_log_probs) == len(loss_masks):
        raise ValueError(
            f"{len(train_log_probs)} train, {len(rollout_log_probs)} rollout log-prob sequences and "
            f"{len(loss_masks)} loss masks: one of each per sequence"
        )
    weights: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []
    metrics: dict[str, list[torch.Tensor]] = {"truncated": [], "rejected": [], "vetoed": []}
    for i, (train, rollout, loss_mask) in enumerate(zip(train_log_probs, rollout_log_probs, loss_masks, strict=True)):
        if not train.shape == rollout.shape == loss_mask.shape:
            raise ValueError(f"sequence {i}: shapes differ: {train.shape}, {rollout.shape}, {loss_mask.shape}")
        mask = loss_mask.float()
        log_ratio = (train - rollout).detach().float()
        ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
        weight = ratio.clamp(max=settings.cap) * mask
        keep = mask.clone()
        if settings.reject_below is not None:
            keep = keep * (ratio >= settings.reject_below)
        if settings.reject_above is not None:
            keep = keep * (ratio <= settings.reject_above)
        vetoed = torch.zeros_like(mask)
        if settings.veto_below is not None and bool(((log_ratio < math.log(settings.veto_below)) & (mask > 0)).any()):
            keep = torch.zeros_like(mask)
            vetoed = torch.ones_like(mask)
        weights.append(weight)
        masks.append(keep)
        metrics["truncated"].append((ratio > settings.cap).float())
        metrics["rejected"].append(mask * (1 - keep))
        metrics["vetoed"].append(vetoed)
    if settings.batch_normalize and weights:
        total = sum(float((w * m.float()).sum()) for w, m in zip(weights, loss_masks, strict=True))
        count = sum(float(m.float().sum()) for m in loss_masks)
        mean = total / max(count, 1.0)
        if mean > 1e-8:
            weights = [w / mean for w in weights]
        metrics["batch_norm_factor"] = [torch.full_like(w, mean if mean > 1e-8 else 1.0) for w in weights]
    metrics["weight"] = weights
    return [w.detach() for w in weights], [m.detach() for m in masks], metrics
