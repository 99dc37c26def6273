"""A stage recipe on the local backend: the recipe mapped onto ``LocalStageConfig``, then ``run_stage``.

The recipe is the one source: its steps, batch, learning rate, budgets, temperatures, clip range, eval
sampling and LoRA settings become the local stage's (``RECIPE_KEYS``). ``cluster.local`` holds only what
is the backend's own (``BACKEND_FIELDS``: model, threads, engine, concurrency, warm start, ...). A recipe
setting the local backend cannot run is an error, or a warning where running without it is the honest
choice (``UNHONOURED``); the local profile (``recipes/profile/local.yaml``) sets each of them to what the
backend runs, so a paper recipe composes cleanly and only an override that asks for more trips the check.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.recipes.schema import StageRecipe

# LocalStageConfig field <- the recipe key it comes from.
RECIPE_KEYS = {
    "steps": "rollout.num_rollout",
    "prompts_per_step": "rollout.rollout_batch_size",
    "samples_per_prompt": "rollout.n_samples_per_prompt",
    "max_response_len": "rollout.rollout_max_response_len",
    "temperature": "rollout.rollout_temperature",
    "lr": "algorithm.lr",
    "clip_eps_low": "algorithm.eps_clip",
    "clip_eps_high": "algorithm.eps_clip_high",
    "eval_temperature": "data.eval_temperature",
    "eval_top_p": "data.eval_top_p",
    "eval_max_response_len": "data.eval_max_response_len",
    "response_budget": "custom.aclarena_response_budget",
    "lora": "lora",
    "env": "data.env",
    "env_config": "env_config.<tag>",
    "output_dir": "paths.runs and name",
}
# What cluster.local may set: the backend's own settings.
BACKEND_FIELDS = (
    "model", "backbone", "base_adapter", "seed", "data_path", "eval_data_path", "eval_size", "top_p",
    "updates_per_step", "engine_host", "engine_port", "max_concurrency", "micro_batch_size", "torch_threads",
    "max_running_requests", "max_prefill_tokens",
    "served_name", "progress", "monitor", "replay", "warm_start_steps", "warm_start_demos", "warm_start_records",
    "warm_start_lr", "warm_start_batch_size", "warm_start_min_reward",
)  # fmt: skip
# Recipe settings the local backend runs one way only: (key, the values it runs, error?, why). Another value
# is an error, or with error=False a warning (the stage runs without it).
UNHONOURED: tuple[tuple[str, tuple[Any, ...], bool, str], ...] = (
    ("algorithm.advantage_estimator", ("grpo",), True, "the local trainer takes a GRPO step"),
    ("algorithm.use_kl_loss", (False,), False, "the local trainer has no KL term; the stage runs without it"),
    ("algorithm.use_tis", (False,), True, "the local engine and trainer share the weights: no mismatch to correct"),
    ("algorithm.entropy_coef", (0.0,), True, "the local trainer has no entropy bonus"),
    ("algorithm.optimizer", ("adam",), True, "the local trainer runs AdamW"),
    ("algorithm.weight_decay", (0.0,), True, "the local trainer's AdamW has no weight decay"),
    ("algorithm.adam_beta1", (0.9,), True, "the local trainer's AdamW betas are (0.9, 0.999)"),
    ("algorithm.adam_beta2", (0.999,), True, "the local trainer's AdamW betas are (0.9, 0.999)"),
    ("algorithm.lr_decay_style", ("constant",), True, "the local trainer keeps the learning rate constant"),
    ("algorithm.lr_warmup_fraction", (None, 0.0), True, "the local trainer has no warm-up"),
    ("rollout.dynamic_sampling_filter_path", (None,), True, "the local stage trains on every group it rolls out"),
    ("rollout.over_sampling_batch_size", (None,), True, "the local stage rolls out exactly its batch"),
    ("data.n_samples_per_eval_prompt", (None, 1), True, "the local stage evaluates one sample per held-out prompt"),
    ("data.eval_interval", (None,), False, "the local stage evaluates before and after training only"),
)


def local_settings(recipe: StageRecipe) -> dict[str, Any]:
    """The recipe's settings as ``LocalStageConfig`` fields (see the module docstring).

    An env without gold demos (no ``cluster.local.warm_start_demos``) runs without the warm start, with a
    warning; so does a stage that continues ``base_adapter``.
    """
    if recipe.kind not in ("rl", "sft") or (recipe.kind == "sft" and recipe.custom.aclarena_sft_filter is None):
        raise RecipeError(
            f"the local backend runs RL stages and SFT warm starts (custom.aclarena_sft_filter); "
            f"{recipe.name} is kind {recipe.kind!r}"
            + (" without a warm-start filter" if recipe.kind == "sft" else "")
        )
    check_honoured(recipe)
    local = dict(recipe.cluster.local)
    misplaced = sorted(set(local) & set(RECIPE_KEYS))
    if misplaced:
        raise RecipeError(
            "cluster.local holds the local backend's own settings only; set "
            + ", ".join(f"{RECIPE_KEYS[k]} instead of cluster.local.{k}" for k in misplaced)
        )
    unknown = sorted(set(local) - set(BACKEND_FIELDS))
    if unknown:
        raise RecipeError(f"unknown cluster.local settings {unknown}; known: {sorted(BACKEND_FIELDS)}")
    algorithm, rollout, data = recipe.algorithm, recipe.rollout, recipe.data
    values: dict[str, Any] = {
        "env": data.env,
        "output_dir": f"{recipe.run_dir}/local",
        "env_config": dict(recipe.env_config.get(data.env) or {}),
        "steps": rollout.num_rollout,
        "prompts_per_step": rollout.rollout_batch_size,
        "samples_per_prompt": rollout.n_samples_per_prompt,
        "max_response_len": rollout.rollout_max_response_len,
        "temperature": rollout.rollout_temperature,
        "lr": algorithm.lr,
        "clip_eps_low": algorithm.eps_clip,
        "clip_eps_high": algorithm.eps_clip_high if algorithm.eps_clip_high is not None else algorithm.eps_clip,
        # slime's None: the rollout's own setting
        "eval_temperature": data.eval_temperature if data.eval_temperature is not None else rollout.rollout_temperature,
        "eval_top_p": data.eval_top_p if data.eval_top_p is not None else 1.0,
        "eval_max_response_len": data.eval_max_response_len,
        "response_budget": recipe.custom.aclarena_response_budget or "total",
    }
    if recipe.lora.enabled:
        values["lora"] = {**recipe.lora.to_dict(), "adapter_name": recipe.lora.adapter_name or data.env}
    elif recipe.kind == "rl":
        warnings.warn(
            f"{recipe.name}: lora.enabled=false (full fine-tuning); the local backend trains a LoRA expert "
            "instead (its default: rank 8, alpha 16 on the four linears; lora=r16_a32 for the paper's)",
            stacklevel=2,
        )
    if local.get("warm_start_steps") and not local.get("warm_start_demos"):
        warnings.warn(
            f"cluster.local: no warm_start_demos for env {data.env!r} (recipes/env/local/{data.env}.yaml); this "
            "stage runs without the SFT warm start (GRPO from the base model)",
            stacklevel=2,
        )
        local["warm_start_steps"] = 0
    if local.get("base_adapter") and local.get("warm_start_steps"):
        warnings.warn(
            "cluster.local: this stage continues base_adapter; it runs without the SFT warm start "
            "(which would change the backbone under the adapter)",
            stacklevel=2,
        )
        local["warm_start_steps"] = 0
    values.update(local)
    return values


def check_honoured(recipe: StageRecipe) -> None:
    """Refuse (or warn about) each recipe setting the local backend cannot run, naming it."""
    for key, honoured, error, why in UNHONOURED:
        value = recipe
        for part in key.split("."):
            value = getattr(value, part)
        if value in honoured:
            continue
        message = f"{key}={value!r}: the local backend cannot honour it ({why}); runs with {honoured[0]!r}"
        if key == "algorithm.use_kl_loss":
            message += f" (kl_loss_coef {recipe.algorithm.kl_loss_coef})"
        if error:
            raise RecipeError(f"{recipe.name}: {message}")
        warnings.warn(f"{recipe.name}: {message}", stacklevel=3)


def local_config(recipe: StageRecipe) -> Any:
    from aclarena_slime.local.config import LocalConfigError, LocalStageConfig

    try:
        return LocalStageConfig.from_mapping(local_settings(recipe))
    except LocalConfigError as exc:
        raise RecipeError(f"{recipe.name} on the local backend: {exc}") from exc


def run_local(recipe: StageRecipe) -> dict[str, Any]:
    """Run the stage on the local backend; returns its metrics and where the adapter is."""
    from aclarena_slime.local.stage import run_stage

    cfg = local_config(recipe)
    if recipe.kind == "sft":  # a warm start: teacher rollouts, the recipe's filter, SFT (aclarena_slime.local.sft_stage)
        from aclarena_slime.local.sft_stage import filter_settings, run_sft_stage

        try:
            settings = filter_settings(dataclasses.asdict(recipe.custom.aclarena_sft_filter))
        except ValueError as exc:
            raise RecipeError(f"custom.aclarena_sft_filter: {exc}") from exc
        metrics = run_sft_stage(cfg, settings, epochs=int(recipe.algorithm.extra.get("num_epoch") or 1))
    else:
        metrics = run_stage(cfg)
    return {"metrics": metrics, "adapter": str(cfg.adapter_dir), "output_dir": cfg.output_dir}
