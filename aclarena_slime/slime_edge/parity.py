"""Train-side parity hooks: the engine's log-probs against Megatron's at every rollout, per expert
(:mod:`aclarena_slime.parity`).

A LoRA stage compiles both of slime's places where the two are in hand (``compile_recipe``):

- :func:`on_rollout`, ``--rollout-data-postprocess-path``: slime's actor calls it once per rollout with
  the rollout id, after its log-prob recompute and before training (``actor.py``). It notes the rollout,
  so that the loss call below checks that rollout's first micro-batch; where slime made a separate
  recompute (``log_probs``: a recipe with slime's TIS, GSPO, several optimiser steps), it compares this
  rank's whole share itself.
- :func:`check_in_loss`, slime's TIS call (``--use-tis --custom-tis-function-path``), when the recipe
  applies no mismatch correction (every LoRA recipe). ``policy_loss_function``
  (``slime/backends/megatron_utils/loss.py``) hands it ``train_log_probs``: slime's separate recompute
  where it made one, else the loss's own forward, detached. With one optimiser step per rollout
  (``actor.py``'s ``can_reuse_log_probs_in_loss``: the MLE recipes) that forward is the only recompute
  there is, and it runs before the rollout's update. The TIS call returns the loss unweighted, so
  slime's policy loss is unchanged.

Checking once, at rollout 0, saw nothing of the adapter: a fresh stage's B is zero there on both sides.
So every rollout is compared, each expert of parallel MLE apart (a sample's expert is its adapter index:
``multimodal_train_inputs`` in the rollout data, and in the loss call the index the routing hook set for
the forward just run), and the gap is printed every time. :class:`~aclarena_slime.parity.ParityGate`
(the recipe's ``parity:``, in the custom config as ``aclarena_parity``) lets the first rollouts calibrate
the limit and stops the job past it with :class:`~aclarena_slime.parity.ParityError`, before the
optimiser runs on that rollout. The adapter the engine served at rollout N came through the weight sync
after rollout N-1, so a bad sync (a wrong q/k/v split, gate/up order, alpha/r, a missing TP gather, the
experts' order) shows from the first rollout served from a trained adapter on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from aclarena_slime import parity
from aclarena_slime.slime_edge.tis import cp_functions

_UNSEEN = -2  # no rollout checked yet (None is a rollout id too: on_rollout not compiled, check once)


@dataclass
class _State:
    """This training process's parity state: the gate and which rollout is being, and was last, checked."""

    gate: parity.ParityGate | None = None
    rollout: int | None = None  # the rollout slime trains on now (on_rollout); None: not told
    checked: int | None = _UNSEEN
    lines: list[str] = field(default_factory=list)  # every gap logged, in order


_state = _State()


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
    """slime's TIS function that corrects nothing: check each rollout's first micro-batch with loss-mask
    tokens, return ``pg_loss`` as it came.

    The log-probs are this context-parallel rank's share of each response; the masks are whole responses.
    """
    if _state.checked != _state.rollout:
        _, local = cp_functions(args)
        masks = [
            local(mask.float(), total, response)
            for mask, total, response in zip(loss_masks, total_lengths, response_lengths, strict=True)
        ]
        if any(bool(mask.any()) for mask in masks):  # a micro-batch of removed samples only: check the next one
            _state.checked = _state.rollout
            where = "first micro-batch, the loss's own forward"
            if _state.rollout is not None:
                where = f"rollout {_state.rollout}, {where}"
            _check(args, where, rollout_log_probs, train_log_probs, masks, _expert_groups(args, _forward_experts()))
    return pg_loss, loss_masks, {}


def on_rollout(args: Any, rollout_id: int, rollout_data: dict[str, Any]) -> None:
    """Note the rollout slime is about to train on; where slime recomputed the log-probs apart from the loss,
    compare ``rollout_log_probs`` (the engine's) with ``log_probs`` (Megatron's) on loss-mask tokens here."""
    _state.rollout = rollout_id
    if "rollout_log_probs" not in rollout_data or "log_probs" not in rollout_data:
        return  # the loss's own forward is the recompute: check_in_loss compares it
    from slime.backends.megatron_utils.cp_utils import slice_log_prob_with_cp

    masks = [
        slice_log_prob_with_cp(mask.float(), total, response)
        for mask, total, response in zip(
            rollout_data["loss_masks"], rollout_data["total_lengths"], rollout_data["response_lengths"], strict=True
        )
    ]
    _state.checked = rollout_id
    experts = _sample_experts(rollout_data.get("multimodal_train_inputs"))
    _check(
        args, f"rollout {rollout_id}", rollout_data["rollout_log_probs"], rollout_data["log_probs"], masks,
        _expert_groups(args, experts, len(masks)),
    )  # fmt: skip


def _sample_experts(inputs: Sequence[Any] | None) -> list[int] | None:
    """Each sample's adapter index from slime's ``multimodal_train_inputs`` (parallel MLE), or None."""
    from aclarena_slime.lora.routing import ADAPTER_INDEX_KEY

    if not inputs or not all(isinstance(item, dict) and ADAPTER_INDEX_KEY in item for item in inputs):
        return None
    return [int(item[ADAPTER_INDEX_KEY].reshape(-1)[0]) for item in inputs]


def _forward_experts() -> list[int] | None:
    from aclarena_slime.lora.routing import last_sample_index

    return last_sample_index()


def _expert_groups(args: Any, experts: Sequence[int] | None, samples: int | None = None) -> list[str] | None:
    """One expert name per sample with parallel MLE (``lora.experts``), else None (one adapter)."""
    lora = getattr(args, "aclarena_lora", None) or {}
    names = list(lora.get("experts") or []) if isinstance(lora, dict) else []
    if len(names) < 2:
        return None
    if experts is None or (samples is not None and len(experts) != samples):
        raise parity.ParityError(
            "parallel MLE parity: no adapter index per sample (multimodal_train_inputs / the routing hook) to "
            "compare each expert apart"
        )
    return [names[k] for k in experts]


def _gate(args: Any) -> parity.ParityGate:
    if _state.gate is None:
        _state.gate = parity.ParityGate(parity.ParitySettings.from_mapping(getattr(args, "aclarena_parity", None)))
    return _state.gate


def _check(
    args: Any,
    where: str,
    engine: Sequence[torch.Tensor],
    trainer: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor],
    groups: Sequence[str] | None,
) -> None:
    """Compare (per expert when ``groups`` names one per sample), print each gap, stop past the limit."""
    gate = _gate(args)
    rows = [[t.tolist() for t in side] for side in (engine, trainer, masks)]
    if groups is not None and len(groups) != len(rows[0]):
        raise parity.ParityError(f"parallel MLE parity: {len(groups)} adapter indices for {len(rows[0])} samples")
    labels = list(groups) if groups is not None else [""] * len(rows[0])
    for group, report in parity.compare_groups(*rows, labels, gate.settings.ceiling).items():
        line = gate.observe(where, group, report)
        _state.lines.append(line)
        print(f"[aclarena] {line}", flush=True)
