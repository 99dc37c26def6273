"""``--custom-tis-function-path``: the authors' mismatch correction (:func:`aclarena_slime.tis.correction`).

Reads ``args.aclarena_tis`` (the recipe's ``custom.aclarena_tis``) and ``context_parallel_size``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from aclarena_slime.slime_edge import custom
from aclarena_slime.tis import correction


def mismatch_tis(
    args: Any,
    *,
    pg_loss: torch.Tensor,
    train_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    total_lengths: list[int],
    response_lengths: list[int],
    **_: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """slime's TIS function: ``(pg_loss reweighted, masks after rejection, metrics)``.

    ``pg_loss`` and the log-probs hold this context-parallel rank's share of each response; the masks are
    whole responses (slime slices them itself). The veto and the normaliser need whole responses, so
    with context parallelism the log-probs are gathered first and the results sliced back.
    """
    gather, local = cp_functions(args)
    lengths = list(zip(total_lengths, response_lengths, strict=True))
    full_train = [gather(t, n, r) for t, (n, r) in zip(train_log_probs, lengths, strict=True)]
    full_rollout = [gather(t, n, r) for t, (n, r) in zip(rollout_log_probs, lengths, strict=True)]
    weights, masks, metrics = correction(full_train, full_rollout, loss_masks, custom.tis(args))

    def flat(values: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([local(v, n, r) for v, (n, r) in zip(values, lengths, strict=True)])

    weight = flat(weights).to(device=pg_loss.device, dtype=pg_loss.dtype)
    return pg_loss * weight, masks, {f"mis_{key}": flat(values).detach() for key, values in metrics.items()}


def cp_functions(args: Any) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    """Gather-to-whole and slice-to-this-rank for each response, ``f(tensor, total_length, response_length)``;
    identities without context parallelism (no slime import then)."""
    if int(getattr(args, "context_parallel_size", 1) or 1) <= 1:
        return (lambda tensor, total, response: tensor), (lambda tensor, total, response: tensor)
    from slime.backends.megatron_utils.cp_utils import all_gather_with_cp, slice_log_prob_with_cp

    return all_gather_with_cp, slice_log_prob_with_cp
