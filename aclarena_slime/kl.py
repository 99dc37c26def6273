"""The one KL estimate between two policies' log-probs of the same tokens, as slime's ``compute_approx_kl``.

Used by the local trainer's KL term and its ``kl_to_start`` figure, the local SFT anchor, and the forgetting
monitor's KL on slime (:mod:`aclarena_slime.slime_edge.policy_kl`): one estimator, so the figures agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where an estimate is taken: the recipe schema reads KL_TYPES
    import torch

KL_TYPES = ("k1", "k2", "k3", "low_var_kl")  # slime's --kl-loss-type


def approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_loss_type: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate of the policy to the reference (slime's ``slime/utils/ppo_utils.py``
    ``compute_approx_kl``, without its unbiased-KL ratio).

    ``k1``: log r; ``k2``: (log r)^2 / 2; ``k3`` / ``low_var_kl``: exp(-log r) - 1 + log r (Schulman's
    non-negative estimator), with r = pi / pi_ref; ``low_var_kl`` is clamped to [-10, 10].
    """
    import torch

    log_ratio = log_probs.float() - ref_log_probs.float()
    if kl_loss_type == "k1":
        kl = log_ratio
    elif kl_loss_type == "k2":
        kl = log_ratio**2 / 2.0
    elif kl_loss_type in ("k3", "low_var_kl"):
        kl = (-log_ratio).exp() - 1 + log_ratio
    else:
        raise ValueError(f"unknown kl_loss_type {kl_loss_type!r} (one of {', '.join(KL_TYPES)})")
    return torch.clamp(kl, min=-10, max=10) if kl_loss_type == "low_var_kl" else kl
