"""The local backend's scope, in one place: the recipe keys a local stage reads, and what it refuses.

The recipe is the one source: its kind, steps, batch, optimiser (AdamW: lr, betas, weight decay), budgets,
temperatures, clip range, KL term, eval sampling, LoRA (or full fine-tuning), SFT filter, replay and monitor
are read by the stage's builder (:func:`aclarena_slime.local.session.open_session`; ``RECIPE_KEYS``, the
allow-list). ``cluster.local`` holds only what is the backend's own
(:class:`~aclarena_slime.recipes.local_section.LocalBackendSettings`: model, threads, engine, concurrency,
warm start, ...; typed and checked when the recipe composes). A recipe setting the
local backend cannot run is an error naming the setting, or a warning where running without it is the
honest choice (``UNHONOURED``); so is every key it would leave aside (:func:`check_local`: the allow-list
``INERT`` and ``EXTRA_KEYS``, ``extra`` included); the local profile (``recipes/profile/local.yaml``) sets each of them to
what the backend runs, so a paper recipe composes cleanly and only an override that asks for more trips
the check.
"""

from __future__ import annotations

import dataclasses
import operator
import warnings
from typing import Any

from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.recipes.schema import RolloutConfig, StageRecipe

# The recipe keys the local stage's builder (:func:`aclarena_slime.local.session.open_session`) reads, each by its own
# line there (tests/local/test_spec_keys.py holds the two to each other); cluster.local is the backend's own.
RECIPE_KEYS = (
    "kind", "data.env", "env_config.<tag>", "paths.runs", "name", "checkpoint.load", "lora",
    "rollout.num_rollout", "rollout.rollout_batch_size", "rollout.n_samples_per_prompt",
    "rollout.rollout_max_response_len", "rollout.rollout_temperature", "rollout.dynamic_sampling_filter_path",
    "rollout.over_sampling_batch_size", "rollout.num_steps_per_rollout", "rollout.global_batch_size",
    "algorithm.lr", "algorithm.weight_decay", "algorithm.adam_beta1", "algorithm.adam_beta2",
    "algorithm.kl_loss_type", "algorithm.kl_loss_coef", "algorithm.use_kl_loss", "algorithm.advantage_estimator",
    "algorithm.eps_clip", "algorithm.eps_clip_high", "algorithm.extra.calculate_per_token_loss",
    "algorithm.extra.num_epoch", "data.eval_temperature", "data.eval_top_p", "data.n_samples_per_eval_prompt",
    "data.eval_max_response_len", "custom.aclarena_sft_filter", "custom.aclarena_replay", "custom.aclarena_filters",
    "custom.aclarena_response_budget", "monitor",
)  # fmt: skip
# Recipe settings the local backend runs one way only: (key, the values it runs, error?, why). Another value
# is an error, or with error=False a warning (the stage runs without it).
UNHONOURED: tuple[tuple[str, tuple[Any, ...], bool, str], ...] = (
    ("algorithm.advantage_estimator", ("grpo", "gspo"), True, "the local trainer's losses are GRPO's and GSPO's"),
    ("algorithm.use_tis", (False,), True, "the local engine and trainer share the weights: no mismatch to correct"),
    ("algorithm.entropy_coef", (0.0,), True, "the local trainer has no entropy bonus"),
    ("algorithm.optimizer", ("adam",), True, "the local trainer runs AdamW"),
    ("algorithm.lr_decay_style", ("constant",), True, "the local trainer keeps the learning rate constant"),
    ("algorithm.lr_warmup_fraction", (None, 0.0), True, "the local trainer has no warm-up"),
    ("data.eval_interval", (None,), False, "the local stage evaluates before and after training only"),
)
# The algorithm's and the rollout's settings that slime reads and the local backend needs no counterpart for:
# the key and why leaving it aside trains the same thing. Every other field of these sections is read
# (RECIPE_KEYS, UNHONOURED), or refused unless at its default (tests/local/test_spec_keys.py holds every field to one).
INERT: dict[str, str] = {
    "algorithm.name": "a label",
    "algorithm.min_lr": "the floor of a decaying lr; the local lr is constant (algorithm.lr_decay_style)",
    "rollout.balance_data": "balances sequence lengths across data-parallel ranks; the local trainer is one process",
}
# The free-form flag maps, key by key: ``algorithm.extra`` and the stage's ``extra``. A key maps to the values
# the local backend runs (None: any) and why; a key not here, set to anything but null, is an error naming it.
EXTRA_KEYS: dict[str, dict[str, tuple[tuple[Any, ...] | None, str]]] = {
    "algorithm.extra": {
        "num_epoch": (None, "read: an SFT stage's epochs over its kept rollouts"),
        "calculate_per_token_loss": (None, "read: the loss's aggregation (aclarena_slime.local.losses)"),
        "use_precision_aware_optimizer": (None, "Megatron's optimiser-state precision on the GPU; the same AdamW"),
        "optimizer_cpu_offload": (None, "where Megatron keeps the optimiser state; the same AdamW"),
        "overlap_cpu_optimizer_d2h_h2d": (None, "Megatron's optimiser-offload transfers; the same AdamW"),
        "custom_tis_function_path": (None, "slime calls it only with algorithm.use_tis, which runs off locally"),
        "loss_type": (("policy_loss", "sft_loss"), "the stage's kind says which loss (an SFT stage: SFT)"),
        "loss_mask_type": (("qwen3",), "the local SFT masks the assistant's tokens, as a rollout's loss mask does"),
        "disable_compute_advantages_and_returns": ((True,), "the local SFT stage takes no advantages"),
        "debug_train_only": ((True,), "the local SFT stage trains on kept teacher rollouts, no GRPO rollout"),
    },
    "extra": {},
}


def check_local(recipe: StageRecipe) -> None:
    """Refuse, naming it, what the local backend cannot run: a kind other than RL or an SFT warm start; a setting
    it runs one way only (:data:`UNHONOURED`: an error, or a warning where running without it is the honest choice);
    and every key it would leave aside: an algorithm or rollout field neither read (:data:`RECIPE_KEYS`,
    :data:`UNHONOURED`) nor :data:`INERT` and not at its default, and every key of ``algorithm.extra`` or the stage's
    ``extra`` outside :data:`EXTRA_KEYS` (null counts as unset)."""
    if recipe.kind not in ("rl", "sft") or (recipe.kind == "sft" and recipe.custom.aclarena_sft_filter is None):
        raise RecipeError(
            f"the local backend runs RL stages and SFT warm starts (custom.aclarena_sft_filter); "
            f"{recipe.name} is kind {recipe.kind!r}" + (" without a warm-start filter" if recipe.kind == "sft" else "")
        )
    for key, honoured, error, why in UNHONOURED:
        value = operator.attrgetter(key)(recipe)
        if value in honoured:
            continue
        message = f"{key}={value!r}: the local backend cannot honour it ({why}); runs with {honoured[0]!r}"
        if key == "algorithm.use_kl_loss":
            message += f" (kl_loss_coef {recipe.algorithm.kl_loss_coef})"
        if error:
            raise RecipeError(f"{recipe.name}: {message}")
        warnings.warn(f"{recipe.name}: {message}", stacklevel=3)
    for section in ("algorithm", "rollout"):
        value, default = getattr(recipe, section), type(getattr(recipe, section))()
        for f in dataclasses.fields(value):
            key = f"{section}.{f.name}"
            if f.name == "extra" or key in INERT or key in read_keys():
                continue
            if getattr(value, f.name) != getattr(default, f.name, None):
                raise RecipeError(
                    f"{recipe.name}: {key}={getattr(value, f.name)!r}: the local backend does not honour it "
                    f"(set it to {getattr(default, f.name, None)!r}, or run the stage on slime)"
                )
    for where, allowed in EXTRA_KEYS.items():
        flags = recipe.algorithm.extra if where == "algorithm.extra" else recipe.extra
        for name, value in (flags or {}).items():
            if value is None:
                continue
            values = allowed[name][0] if name in allowed else ()
            if name not in allowed or (values is not None and value not in values):
                accepted = "" if name not in allowed else f" (it runs {', '.join(map(repr, values or ()))})"
                raise RecipeError(
                    f"{recipe.name}: {where}.{name}={value!r}: the local backend does not honour it{accepted}; "
                    "drop it (or set it to null) for a local run, or run the stage on slime"
                )
    loss_type = recipe.algorithm.extra.get("loss_type")
    if loss_type is not None and (loss_type == "sft_loss") != (recipe.kind == "sft"):
        raise RecipeError(f"{recipe.name}: algorithm.extra.loss_type={loss_type!r} on a {recipe.kind!r} stage: "
                          "the local backend trains an SFT stage's loss on kind sft only")  # fmt: skip


def read_keys() -> set[str]:
    """The algorithm and rollout fields the local backend reads (their names in :data:`RECIPE_KEYS` and
    :data:`UNHONOURED`)."""
    return set(RECIPE_KEYS) | {key for key, *_ in UNHONOURED}


def steps_per_rollout(rollout: RolloutConfig, name: str) -> int:
    """The optimiser steps a GRPO step (or an SFT stage's epoch) takes: the rollout's samples over slime's global
    batch (one when neither ``global_batch_size`` nor ``num_steps_per_rollout`` is set). A batch that does not
    divide the rollout is an error: slime refuses one larger than it and drops what an uneven split leaves over."""
    try:
        per_update = rollout.samples_per_update()
    except ValueError as exc:
        raise RecipeError(f"{name}: {exc}") from exc
    rollouts = rollout.rollout_batch_size * rollout.n_samples_per_prompt
    if per_update is None:
        return 1
    if not 1 <= per_update <= rollouts or rollouts % per_update:
        raise RecipeError(
            f"{name}: rollout.global_batch_size={per_update} does not divide a step's {rollouts} rollouts "
            f"(rollout_batch_size {rollout.rollout_batch_size} x n_samples_per_prompt {rollout.n_samples_per_prompt}); "
            "set it to a divisor, or rollout.num_steps_per_rollout"
        )
    return rollouts // per_update
