"""Train-side parity hook (``--rollout-data-postprocess-path``): the first batch's engine log-probs against
Megatron's recompute, before any update (:mod:`aclarena_slime.parity`).

Slime calls it in every training actor after it computed ``log_probs`` (the recompute) and before the
train step (``slime/backends/megatron_utils/actor.py``, ``rollout_data_postprocess(args, rollout_id,
rollout_data)``). The recompute exists only when slime does not reuse the loss's own forward: the
compiler passes ``--get-mismatch-metrics`` with this hook for that reason. Each rank checks its own
share of the batch (its data-parallel part, its context-parallel chunk of every sequence); a rank
whose gap exceeds ``aclarena_parity_tolerance`` (default :data:`~aclarena_slime.parity.SLIME_TOLERANCE`)
raises, which ends the job before the optimiser runs. Ranks without the recompute (pipeline stages
before the last) have nothing to compare.
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
        from megatron.core import mpu

        if not mpu.is_pipeline_last_stage():
            return
        raise parity.ParityError(
            "the parity check needs slime's recompute of the log-probs (rollout_data['log_probs']); "
            "run with --get-mismatch-metrics"
        )
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
