"""A stage recipe on the local backend: the recipe mapped onto ``LocalStageConfig``, then ``run_stage``."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.recipes.schema import StageRecipe


def local_settings(recipe: StageRecipe) -> dict[str, Any]:
    """The recipe's settings as ``LocalStageConfig`` fields; ``cluster.local`` has the last word.

    ``cluster.local.env_config`` and ``cluster.local.warm_start_demos`` hold one entry per env tag, and
    ``max_response_len`` may (with a ``default``): the stage's env picks its own. An env without demos
    runs without the warm start, with a warning.
    """
    if recipe.kind not in ("rl", "sft") or (recipe.kind == "sft" and recipe.custom.aclarena_sft_filter is None):
        raise RecipeError(
            f"the local backend runs RL stages and SFT warm starts (custom.aclarena_sft_filter); "
            f"{recipe.name} is kind {recipe.kind!r}"
            + (" without a warm-start filter" if recipe.kind == "sft" else "")
        )
    algorithm = recipe.algorithm
    values: dict[str, Any] = {
        "env": recipe.data.env,
        "output_dir": f"{recipe.run_dir}/local",
        "env_config": dict(recipe.env_config.get(recipe.data.env) or {}),
        "temperature": recipe.rollout.rollout_temperature,
        "clip_eps_low": algorithm.eps_clip,
        "clip_eps_high": algorithm.eps_clip_high if algorithm.eps_clip_high is not None else algorithm.eps_clip,
    }
    if recipe.lora.enabled:
        values.update(
            lora_rank=recipe.lora.rank,
            lora_alpha=recipe.lora.alpha,
            lora_dropout=recipe.lora.dropout,
            lora_target_modules=tuple(recipe.lora.target_modules),
            adapter_name=recipe.lora.adapter_name or recipe.data.env,
        )
    local = dict(recipe.cluster.local)
    values["env_config"] = _merged(
        values["env_config"], (local.pop("env_config", None) or {}).get(recipe.data.env) or {}
    )
    if isinstance(local.get("max_response_len"), dict):  # per env tag, else its "default"
        budgets = local["max_response_len"]
        local["max_response_len"] = budgets.get(recipe.data.env, budgets.get("default"))
        if local["max_response_len"] is None:
            raise RecipeError(f"cluster.local.max_response_len names neither {recipe.data.env!r} nor 'default'")
    demos = local.pop("warm_start_demos", None)
    if isinstance(demos, dict):  # one demo-turns function per env tag
        demos = demos.get(recipe.data.env)
        if demos is None and local.get("warm_start_steps"):
            warnings.warn(
                f"cluster.local: no warm_start_demos for env {recipe.data.env!r}; this stage runs without "
                "the SFT warm start (GRPO from the base model)",
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
    if demos is not None:
        values["warm_start_demos"] = demos
    values.update(local)
    return values


def _merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``, recursively; a None value removes the key."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def local_config(recipe: StageRecipe) -> Any:
    from aclarena_slime.local.config import LocalConfigError, LocalStageConfig

    try:
        return LocalStageConfig.from_mapping(local_settings(recipe))
    except LocalConfigError as exc:
        raise RecipeError(f"cluster.local: {exc}") from exc


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
