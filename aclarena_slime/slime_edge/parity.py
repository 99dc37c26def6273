"""Train-side parity hooks: the engine's log-probs of the first batch against Megatron's, before any update
(:mod:`aclarena_slime.parity`).

Slime has two places where both are in hand, and a LoRA stage compiles one of them (``compile_recipe``):

- :func:`check_in_loss`, slime's TIS call (``--use-tis --custom-tis-function-path``), when the recipe
  applies no mismatch correction (every LoRA recipe). ``policy_loss_function``
  (``slime/backends/megatron_utils/loss.py``) hands it ``train_log_probs``: slime's separate recompute
  where it made one, else the loss's own forward, detached. With one optimiser step per rollout
  (``actor.py``'s ``can_reuse_log_probs_in_loss``: the MLE recipes) that forward is the only recompute
  there is, and in the first step it runs before any update. A custom ``--loss-type`` cannot see it:
  slime then stops reusing the loss's forward and pays a separate recompute at every step. The TIS call
  returns the loss unweighted, so slime's policy loss is unchanged.
- :func:`check_first_batch`, ``--rollout-data-postprocess-path``, when the recipe applies slime's TIS
  itself (the TIS call is then the correction's): it compares where slime made a separate recompute
  (``log_probs``) and otherwise says it checked nothing.

Each training rank checks its own share (its data-parallel part, its context-parallel chunk of every
response) once per process; a gap above ``aclarena_parity_tolerance`` (default
:data:`~aclarena_slime.parity.SLIME_TOLERANCE`) raises :class:`~aclarena_slime.parity.ParityError`, which
ends the job before the optimiser runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from aclarena_slime import parity
from aclarena_slime.slime_edge.tis import cp_functions

_checked = False  # once per training process: its first batch


def check_in_loss(
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
    """slime's TIS function that corrects nothing: check the first micro-batch with loss-mask tokens, return
    ``pg_loss`` as it came.

    The log-probs are this context-parallel rank's share of each response; the masks are whole responses.
    """
    global _checked
    if not _checked:
        _, local = cp_functions(args)
        masks = [
            local(mask.float(), total, response)
            for mask, total, response in zip(loss_masks, total_lengths, response_lengths, strict=True)
        ]
        if any(bool(mask.any()) for mask in masks):  # a micro-batch of removed samples only: check the next one
            _checked = True
            _require(args, "first micro-batch, the loss's own forward", rollout_log_probs, train_log_probs, masks)
    return pg_loss, loss_masks, {}


def check_first_batch(args: Any, rollout_id: int, rollout_data: dict[str, Any]) -> None:
    """Compare ``rollout_log_probs`` (the engine's) with ``log_probs`` (Megatron's) on loss-mask tokens."""
    global _checked
    if _checked or "rollout_log_probs" not in rollout_data:
        return
    _checked = True
    if "log_probs" not in rollout_data:
        print(
            f"[aclarena] rollout {rollout_id}: log-prob parity not checked: slime computed no separate "
            "recompute of the log-probs for this batch (it reuses the loss's forward)",
            flush=True,
        )
        return
    from slime.backends.megatron_utils.cp_utils import slice_log_prob_with_cp

    masks = [
        slice_log_prob_with_cp(mask.float(), total, response)
        for mask, total, response in zip(
            rollout_data["loss_masks"], rollout_data["total_lengths"], rollout_data["response_lengths"], strict=True
        )
    ]
    _require(args, f"rollout {rollout_id}", rollout_data["rollout_log_probs"], rollout_data["log_probs"], masks)


def _require(
    args: Any,
    where: str,
    engine: Sequence[torch.Tensor],
    trainer: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor],
) -> None:
    tolerance = float(getattr(args, "aclarena_parity_tolerance", None) or parity.SLIME_TOLERANCE)
    report = parity.compare(
        [t.tolist() for t in engine], [t.tolist() for t in trainer], [m.tolist() for m in masks], tolerance
    )
    parity.require(report)
    print(f"[aclarena] {where}: {report.line()}", flush=True)
