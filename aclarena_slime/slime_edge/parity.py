"""Train-side parity hook (``--rollout-data-postprocess-path``): the first batch's engine log-probs against
Megatron's recompute, before any update (:mod:`aclarena_slime.parity`).

Slime calls it in every training actor before the train step (``slime/backends/megatron_utils/actor.py``,
``rollout_data_postprocess(args, rollout_id, rollout_data)``), after its recompute of the log-probs
(``log_probs``) when it made one: slime skips the recompute when it can reuse the loss's own forward
(one optimiser step per rollout, no reward KL, no mismatch metrics), and then there is nothing to compare
before the update: the hook says so and checks nothing. (``--get-mismatch-metrics`` would force the
recompute, but slime then requires and applies a TIS function to the loss.) Each rank checks its own
share of the batch (its data-parallel part, its context-parallel chunk of every sequence); a rank whose
gap exceeds ``aclarena_parity_tolerance`` (default :data:`~aclarena_slime.parity.SLIME_TOLERANCE`)
raises, which ends the job before the optimiser runs.
"""

from __future__ import annotations

from typing import Any

from aclarena_slime import parity

_checked = False  # once per training process: its first batch


def check_first_batch(args: Any, rollout_id: int, rollout_data: dict[str, Any]) -> None:
    """Compare ``rollout_log_probs`` (the engine's) with ``log_probs`` (Megatron's) on loss-mask tokens."""
    global _checked
    if _checked or "rollout_log_probs" not in rollout_data:
        return
    if "log_probs" not in rollout_data:
        # Slime reuses the loss's own forward instead of a separate recompute (one optimiser step per rollout,
        # no reward KL, no mismatch metrics): nothing to compare before the update. --get-mismatch-metrics
        # would force the recompute, but slime then also applies the TIS function to the loss.
        _checked = True
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
    tolerance = float(getattr(args, "aclarena_parity_tolerance", None) or parity.SLIME_TOLERANCE)
    report = parity.compare(
        [t.tolist() for t in rollout_data["rollout_log_probs"]],
        [t.tolist() for t in rollout_data["log_probs"]],
        [m.tolist() for m in masks],
        tolerance,
    )
    _checked = True
    parity.require(report)
    print(f"[aclarena] rollout {rollout_id}: {report.line()}", flush=True)
