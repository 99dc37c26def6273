"""The local backend's scope, in one place: a stage recipe mapped onto ``LocalStageConfig``, and what it refuses.

The recipe is the one source: its kind, steps, batch, optimiser (AdamW: lr, betas, weight decay), budgets,
temperatures, clip range, KL term, eval sampling, LoRA (or full fine-tuning), SFT filter, replay and monitor
become the local stage's (``RECIPE_KEYS``). ``cluster.local`` holds only what is the backend's own
(:class:`~aclarena_slime.recipes.local_section.LocalBackendSettings`: model, threads, engine, concurrency,
warm start, ...; typed and checked when the recipe composes). A recipe setting the
local backend cannot run is an error naming the setting, or a warning where running without it is the
honest choice (``UNHONOURED``); so is every key it would leave aside (:func:`check_known`: the allow-list
``INERT`` and ``EXTRA_KEYS``, ``extra`` included); the local profile (``recipes/profile/local.yaml``) sets each of them to
what the backend runs, so a paper recipe composes cleanly and only an override that asks for more trips
the check. :func:`local_plan` is what ``--dry-run`` prints.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aclarena_slime.experts import EXPERTS_NAME
from aclarena_slime.local.config import LocalConfigError, LocalStageConfig
from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.recipes.schema import StageRecipe

if TYPE_CHECKING:
    from aclarena_slime.local.session import LocalSession

# LocalStageConfig field <- the recipe key it comes from, as is (local_settings reads each with one loop).
PLAIN_KEYS = {
    "steps": "rollout.num_rollout",
    "prompts_per_step": "rollout.rollout_batch_size",
    "samples_per_prompt": "rollout.n_samples_per_prompt",
    "max_response_len": "rollout.rollout_max_response_len",
    "temperature": "rollout.rollout_temperature",
    "kind": "kind",
    "lr": "algorithm.lr",
    "weight_decay": "algorithm.weight_decay",
    "adam_beta1": "algorithm.adam_beta1",
    "adam_beta2": "algorithm.adam_beta2",
    "kl_loss_type": "algorithm.kl_loss_type",
    "advantage_estimator": "algorithm.advantage_estimator",
    "group_filter": "rollout.dynamic_sampling_filter_path",
    "over_sampling_prompts": "rollout.over_sampling_batch_size",
    "clip_eps_low": "algorithm.eps_clip",
    "eval_max_response_len": "data.eval_max_response_len",
    "env": "data.env",
}
# LocalStageConfig field <- the recipe key(s) it is made of, each by its own line in local_settings.
RECIPE_KEYS = {
    **PLAIN_KEYS,
    "kl_coef": "algorithm.kl_loss_coef (with algorithm.use_kl_loss)",
    "per_token_loss": "algorithm.extra.calculate_per_token_loss",
    "full_finetune": "lora.enabled (false)",
    "sft_filter": "custom.aclarena_sft_filter",
    "sft_epochs": "algorithm.extra.num_epoch",
    "replay": "custom.aclarena_replay",
    "monitor": "monitor",
    "steps_per_rollout": "rollout.num_steps_per_rollout (or rollout.global_batch_size)",
    "filter_settings": "custom.aclarena_filters",
    "clip_eps_high": "algorithm.eps_clip_high",
    "eval_temperature": "data.eval_temperature",
    "eval_top_p": "data.eval_top_p",
    "eval_samples": "data.n_samples_per_eval_prompt",
    "response_budget": "custom.aclarena_response_budget",
    "lora": "lora",
    "env_config": "env_config.<tag>",
    "output_dir": "paths.runs and name",
}
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


def local_settings(recipe: StageRecipe) -> dict[str, Any]:
    """The recipe's settings as ``LocalStageConfig`` fields (see the module docstring).

    An env without gold demos (no ``cluster.local.warm_start_demos``) runs without the warm start, with a
    warning; so does a stage that continues ``base_adapter``.
    """
    if recipe.kind not in ("rl", "sft") or (recipe.kind == "sft" and recipe.custom.aclarena_sft_filter is None):
        raise RecipeError(
            f"the local backend runs RL stages and SFT warm starts (custom.aclarena_sft_filter); "
            f"{recipe.name} is kind {recipe.kind!r}" + (" without a warm-start filter" if recipe.kind == "sft" else "")
        )
    check_honoured(recipe)
    check_known(recipe)
    local = dataclasses.asdict(recipe.cluster.local)  # typed and checked when the recipe composed
    algorithm, rollout, data = recipe.algorithm, recipe.rollout, recipe.data
    values: dict[str, Any] = {field: _read(recipe, key) for field, key in PLAIN_KEYS.items()}
    values.update({
        "output_dir": f"{recipe.run_dir}/local",
        "env_config": dict(recipe.env_config.get(data.env) or {}),
        "clip_eps_high": algorithm.eps_clip_high if algorithm.eps_clip_high is not None else algorithm.eps_clip,
        # slime's None: the rollout's own setting
        "eval_temperature": data.eval_temperature if data.eval_temperature is not None else rollout.rollout_temperature,
        "eval_top_p": data.eval_top_p if data.eval_top_p is not None else 1.0,
        "eval_samples": data.n_samples_per_eval_prompt or 1,
        "response_budget": recipe.custom.aclarena_response_budget or "total",
        "filter_settings": dataclasses.asdict(recipe.custom.aclarena_filters) if recipe.custom.aclarena_filters else {},
        "per_token_loss": bool(algorithm.extra.get("calculate_per_token_loss", False)),
        "kl_coef": algorithm.kl_loss_coef if algorithm.use_kl_loss else 0.0,
    })  # fmt: skip
    values["steps_per_rollout"] = steps_per_rollout(recipe)
    if algorithm.use_kl_loss and algorithm.kl_loss_coef <= 0:
        raise RecipeError(f"{recipe.name}: algorithm.use_kl_loss=true needs algorithm.kl_loss_coef > 0")
    if recipe.lora.enabled:
        values["lora"] = {**recipe.lora.to_dict(), "adapter_name": recipe.lora.adapter_name or data.env}
    else:
        values["full_finetune"] = True
    if recipe.kind == "sft":
        values["sft_filter"] = recipe.custom.aclarena_sft_filter
        values["sft_epochs"] = int(algorithm.extra.get("num_epoch") or 1)
    replay = recipe.custom.aclarena_replay
    if replay is not None and replay.enabled and replay.data:
        values["replay"] = {
            **{k: v for k, v in dataclasses.asdict(replay).items() if k != "data"},
            "current": replay.current or data.env,
            "domains": list(replay.data),
            "env_config": {tag: dict(recipe.env_config.get(tag) or {}) for tag in replay.data},
        }
    if recipe.monitor.active:
        values["monitor"] = recipe.monitor.to_dict()
    load = recipe.checkpoint.load
    if local["backbone"] is None and isinstance(load, str) and (Path(load) / "config.json").is_file():
        local["backbone"] = load  # the model a previous local stage fine-tuned in full (cluster.local's wins)
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


def _read(recipe: StageRecipe, key: str) -> Any:
    """The recipe's value at a dotted ``key`` (``rollout.num_rollout``)."""
    value: Any = recipe
    for part in key.split("."):
        value = getattr(value, part)
    return value


def check_honoured(recipe: StageRecipe) -> None:
    """Refuse (or warn about) each recipe setting the local backend cannot run, naming it."""
    for key, honoured, error, why in UNHONOURED:
        value = _read(recipe, key)
        if value in honoured:
            continue
        message = f"{key}={value!r}: the local backend cannot honour it ({why}); runs with {honoured[0]!r}"
        if key == "algorithm.use_kl_loss":
            message += f" (kl_loss_coef {recipe.algorithm.kl_loss_coef})"
        if error:
            raise RecipeError(f"{recipe.name}: {message}")
        warnings.warn(f"{recipe.name}: {message}", stacklevel=3)


def check_known(recipe: StageRecipe) -> None:
    """Refuse, naming it, every key the local backend would leave aside: an algorithm or rollout field neither
    read (:data:`RECIPE_KEYS`, :data:`UNHONOURED`) nor :data:`INERT` and not at its default, and every key of
    ``algorithm.extra`` or the stage's ``extra`` outside :data:`EXTRA_KEYS` (null counts as unset)."""
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
    named = {key for source in RECIPE_KEYS.values() for key in source.replace("(", " ").replace(")", " ").split()}
    return named | {key for key, *_ in UNHONOURED}


def local_config(recipe: StageRecipe) -> LocalStageConfig:
    """The recipe as the local stage's settings; a setting that cannot work is a :class:`RecipeError`."""
    try:
        return LocalStageConfig.from_mapping(local_settings(recipe))
    except LocalConfigError as exc:
        raise RecipeError(f"{recipe.name} on the local backend: {exc}") from exc


def steps_per_rollout(recipe: StageRecipe) -> int:
    """The optimiser steps a GRPO step (or an SFT stage's epoch) takes: the rollout's samples over slime's global
    batch (one when neither ``global_batch_size`` nor ``num_steps_per_rollout`` is set). A batch that does not
    divide the rollout is an error: slime refuses one larger than it and drops what an uneven split leaves over."""
    rollout = recipe.rollout
    try:
        per_update = rollout.samples_per_update()
    except ValueError as exc:
        raise RecipeError(f"{recipe.name}: {exc}") from exc
    rollouts = rollout.rollout_batch_size * rollout.n_samples_per_prompt
    if per_update is None:
        return 1
    if not 1 <= per_update <= rollouts or rollouts % per_update:
        raise RecipeError(
            f"{recipe.name}: rollout.global_batch_size={per_update} does not divide a step's {rollouts} rollouts "
            f"(rollout_batch_size {rollout.rollout_batch_size} x n_samples_per_prompt {rollout.n_samples_per_prompt}); "
            "set it to a divisor, or rollout.num_steps_per_rollout"
        )
    return rollouts // per_update


def local_plan(session: LocalSession) -> str:
    """What ``--dry-run`` prints for a local stage (:func:`~aclarena_slime.local.session.open_session`'s parts):
    its phases and every resolved setting."""
    loop, policy, warm, sft = session.loop, session.policy, session.warm_start, session.sft
    sampling, loss = loop.sampling, policy.train.loss
    phases = []
    if warm is not None:
        phases.append(f"warm start ({warm.sft.steps} SFT steps on {warm.demos} gold demos)")
    if session.kind == "sft":
        text = f"{sft.epochs} epoch(s) on teacher rollouts kept by {sft.filter}"
        if sft.steps_per_epoch > 1:
            text += f", {sft.steps_per_epoch} optimiser steps an epoch"
        phases.append(f"SFT ({text})")
    else:
        grpo = f"{loop.steps} steps x {sampling.prompts_per_step} prompts x {sampling.groups.samples} samples"
        if loop.dynamic_sampling:
            kept = sampling.group_filter.path if sampling.group_filter else "no filter"
            grpo += (f"; groups kept by {kept}, sampled {sampling.prompts_per_round} prompts a "
                     f"round, at most {sampling.max_rounds} rounds a step")  # fmt: skip
        minibatches = policy.train.minibatches
        if minibatches > 1:
            per_update = sampling.prompts_per_step * sampling.groups.samples // minibatches
            grpo += f"; {minibatches} optimiser steps of {per_update} samples a step"
        phases.append(f"GRPO ({grpo})")
    kind = "full fine-tuning (every parameter)" if policy.full else f"LoRA expert {policy.name!r}"
    kl = f"KL {loss.kl_loss_type} x {loss.kl_coef} to the starting policy" if loss.kl_coef else "no KL term"
    lines = [
        f"# local plan: env {session.env}, model {session.model.source}, seed {session.seed}",
        f"# phases: {' -> '.join(phases)}",
        f"# policy: {kind}; AdamW lr {policy.train.lr}; {kl}",
        f"# loss: {loss.estimator}, " + ("the token mean" if loss.per_token else "the per-sample mean")
        + " (aclarena_slime.local.losses)",
        f"# outputs: {session.paths.output_dir}",
    ]
    return "\n".join(lines + ["#   " + line for line in json.dumps(session.settings, indent=2, default=str).splitlines()])


def _local_env(tag: str) -> dict[str, Any]:
    """The env's own local-backend settings (``recipes/env/local/<tag>.yaml``'s ``env_config.<tag>``): the
    local profile composes them for the data's env only, and a parallel-MLE expert of another env needs them.
    A variant tag (``PLUGIN-VARIANT``) without a file of its own has its plugin's."""
    import yaml

    from aclarena_slime.plugin.registry import UnknownEnvironment, plugin_tag
    from aclarena_slime.recipes.compiler import REPO_ROOT

    folder = REPO_ROOT / "recipes" / "env" / "local"
    own = tag
    if not (folder / f"{tag}.yaml").is_file():
        try:
            own = plugin_tag(tag)
        except UnknownEnvironment:
            return {}
    path = folder / f"{own}.yaml"
    values = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    return dict(((values or {}).get("env_config") or {}).get(own) or {})


def expert_sessions(recipe: StageRecipe, session: LocalSession) -> list[LocalSession]:
    """Parallel MLE (``lora.experts``): one expert's session per env tag, the stage's (its
    :func:`~aclarena_slime.local.session.open_session`) otherwise equal: the tag's env and env settings, a LoRA
    adapter of the tag's name, outputs under ``experts/<tag>``.

    The experts share the frozen backbone, so none of them warm-starts it (a warning says so when the env's
    local profile asks for a warm start)."""
    policy, records = session.policy, session.records
    # the stage's LoRA settings (with full fine-tuning the policy has none: its experts are refused by open_experts)
    lora = policy.lora or LoraConfig.from_mapping(dict(session.settings["lora"]))
    if session.warm_start is not None:
        warnings.warn(
            "lora.experts: parallel MLE trains on the frozen backbone; it runs without the warm start", stacklevel=2
        )
    out = []
    for tag in lora.experts or []:
        env_config = records.env_config if tag == session.env else {**(recipe.env_config.get(tag) or {}),
                                                                    **_local_env(tag)}  # fmt: skip
        expert = dataclasses.replace(lora, adapter_name=tag, experts=None)
        output_dir = session.paths.output_dir / "experts" / tag
        settings = {"env": tag, "env_config": dict(env_config), "lora": expert.to_dict(), "warm_start_steps": 0,
                    "output_dir": str(output_dir)}  # fmt: skip
        out.append(dataclasses.replace(
            session,
            env=tag,
            paths=dataclasses.replace(session.paths, output_dir=output_dir),
            records=dataclasses.replace(records, env=tag, env_config=env_config, warm_start_records=0),
            policy=dataclasses.replace(policy, name=tag, lora=None if policy.full else expert),
            warm_start=None,
            settings={**session.settings, **settings},
        ))  # fmt: skip
    return out


def run_local(recipe: StageRecipe) -> dict[str, Any]:
    """Run the stage on the local backend; returns its metrics and where the policy is (with ``lora.experts``,
    the experts' manifest)."""
    from aclarena_slime.local.session import open_session
    from aclarena_slime.local.stage import run_stage

    cfg = local_config(recipe)
    if cfg.lora.experts:
        from aclarena_slime.local.parallel_mle import open_experts, run_parallel_mle

        metrics = run_parallel_mle(open_experts(expert_sessions(recipe, open_session(cfg))), cfg.output_dir)
        manifest = str(Path(cfg.output_dir) / EXPERTS_NAME)
        return {"metrics": metrics, "policy": manifest, "full": False, "output_dir": cfg.output_dir}
    metrics = run_stage(cfg)
    return {"metrics": metrics, "policy": str(cfg.policy_dir), "full": cfg.full_finetune, "output_dir": cfg.output_dir}
