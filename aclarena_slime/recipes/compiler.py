"""Stage recipe -> the exact slime command line, the ``--custom-config-path`` YAML and the Ray runtime env.

Each section of :class:`StageRecipe` becomes flags mechanically (field ``kl_loss_coef`` ->
``--kl-loss-coef``; ``True`` -> a bare switch; ``False``/``None`` -> left out; a list -> several
values). Every flag is checked against ``known_flags.txt``; a flag declared twice is an error.
Settings that slime has no flag for travel in the custom-config YAML, which slime turns into
attributes of ``args``: ``aclarena_env_config`` ({tag: env settings}), ``aclarena_experts``
({tag: adapter}; a LoRA stage adds its own adapter for the data's env, so rollouts sample from the
adapter being trained), ``aclarena_lora`` (the LoRA actor's settings, validated by
:class:`aclarena_slime.lora.config.LoraConfig`) and the typed sections of the recipe's ``custom:``
(:class:`aclarena_slime.slime_edge.custom.CustomConfig`). A dotted path of ours must be a hook of
:data:`aclarena_slime.slime_edge.HOOKS` for the flag it is given to.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aclarena_slime.evaluation.suite import EvalSuite, StageRollout, load_suite
from aclarena_slime.lora.config import ADAPTER_PARAM_PATTERN, LoraConfig, LoraConfigError
from aclarena_slime.recipes.addresses import no_proxy_value, ray_cluster_env
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.recipes.flags import check_flags
from aclarena_slime.recipes.schema import StageRecipe
from aclarena_slime.slime_edge import HOOKS
from aclarena_slime.slime_edge import path as hook_path

REPO_ROOT = Path(__file__).resolve().parents[2]
OUR_PACKAGE = "aclarena_slime."
CUSTOM_CONFIG_NAME = "custom_config.yaml"


@dataclass
class SlimeCommand:
    """What ``launch/stage.sh`` runs for the slime backend."""

    train_args: list[str]  # after ``python3 <slime>/train.py``
    custom_config: dict[str, Any]
    custom_config_path: Path
    runtime_env: dict[str, Any]
    train_script: str
    services: dict[str, Any] = field(default_factory=dict)  # name -> ServiceConfig
    eval_config: dict[str, Any] | None = None  # slime's --eval-config, from the recipe's extra.eval_suite

    def argv(self) -> list[str]:
        return ["python3", self.train_script, *self.train_args]

    def submit_argv(self, dashboard: str) -> list[str]:
        """``ray job submit`` wrapping the training command."""
        return [
            "ray", "job", "submit", f"--address={dashboard}",
            f"--runtime-env-json={json.dumps(self.runtime_env, sort_keys=True)}",
            "--", *self.argv(),
        ]  # fmt: skip

    def shell(self, dashboard: str) -> str:
        return " \\\n  ".join(_shell_groups(self.submit_argv(dashboard)))

    def write_custom_config(self) -> Path:
        self.custom_config_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.custom_config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(self.custom_config, sort_keys=False), encoding="utf-8")
        tmp.replace(self.custom_config_path)
        if self.eval_config is not None:  # beside it, where --eval-config points
            eval_path = self.custom_config_path.parent / EVAL_CONFIG_NAME
            eval_path.write_text(yaml.safe_dump(self.eval_config, sort_keys=False), encoding="utf-8")
        return self.custom_config_path


class _Flags:
    """Ordered flags with the recipe key that set each (for error messages and duplicate checks)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any, str]] = []
        self.origins: dict[str, str] = {}  # flag -> the recipe key that set it

    def add(self, name: str, value: Any, origin: str) -> None:
        if value is None or value is False:
            return
        flag = name if name.startswith("--") else "--" + name.replace("_", "-")
        if flag in self.origins:
            raise RecipeError(f"{flag} is set twice: by {self.origins[flag]} and by {origin}")
        if isinstance(value, Mapping):
            raise RecipeError(f"{origin}: {flag} takes a value or a list, not a mapping")
        self.origins[flag] = origin
        self.items.append((flag, value, origin))

    def add_section(self, values: Mapping[str, Any], origin: str, skip: tuple[str, ...] = ()) -> None:
        for key, value in values.items():
            if key not in skip:
                self.add(key, value, f"{origin}.{key}")

    def argv(self) -> list[str]:
        check_flags((flag, origin) for flag, _, origin in self.items)
        _check_hooks(self.items)
        out: list[str] = []
        for flag, value, _ in self.items:
            out.append(flag)
            if value is True:
                continue
            values = value if isinstance(value, list | tuple) else [value]
            out.extend(_text(v) for v in values)
        return out


def compile_recipe(recipe: StageRecipe) -> SlimeCommand:
    """The slime command for one stage; raises :class:`RecipeError` or ``UnknownFlagError``."""
    flags = _Flags()
    cluster = recipe.cluster
    flags.add("actor_num_nodes", cluster.actor_num_nodes, "cluster.actor_num_nodes")
    flags.add("actor_num_gpus_per_node", cluster.actor_num_gpus_per_node, "cluster.actor_num_gpus_per_node")
    flags.add("num_gpus_per_node", cluster.num_gpus_per_node, "cluster.num_gpus_per_node")
    # --debug-train-only (the SFT stages, as slime's own scripts/run-qwen3-4B-base-sft.sh) starts no rollout engine:
    # colocated, slime would still offload the whole trainer to CPU and back at every step for engines that do not exist.
    engines = not (recipe.algorithm.extra.get("debug_train_only") or recipe.extra.get("debug_train_only"))
    if cluster.rollout_num_gpus:
        if cluster.colocate:
            raise RecipeError("cluster.rollout_num_gpus is for a disaggregated layout; set cluster.colocate=false")
        flags.add("rollout_num_gpus", cluster.rollout_num_gpus if engines else None, "cluster.rollout_num_gpus")
    if cluster.train_async:
        _check_async(recipe, engines)
    if engines:
        flags.add("colocate", cluster.colocate, "cluster.colocate")
        per_engine = cluster.rollout_num_gpus_per_engine
        flags.add("rollout_num_gpus_per_engine", per_engine, "cluster.rollout_num_gpus_per_engine")
    flags.add_section(recipe.model.architecture, "model.architecture")
    flags.add("hf_checkpoint", recipe.model.hf_checkpoint, "model.hf_checkpoint")
    if recipe.checkpoint.save_hf and "{" in recipe.checkpoint.save_hf:
        raise RecipeError("checkpoint.save_hf: one folder, not a {rollout_id} template (later stages read it)")
    flags.add_section(dataclasses.asdict(recipe.checkpoint), "checkpoint")
    _data_flags(flags, recipe)
    if recipe.kind != "sft":
        _check_global_batch(recipe)
        flags.add_section(dataclasses.asdict(recipe.rollout), "rollout")
    else:
        flags.add("rollout_batch_size", recipe.rollout.rollout_batch_size, "rollout.rollout_batch_size")
        flags.add("global_batch_size", recipe.rollout.global_batch_size, "rollout.global_batch_size")
    algorithm = dataclasses.asdict(recipe.algorithm)
    skip = ("name", "extra") if recipe.kind != "sft" else _SFT_SKIPS
    flags.add_section(algorithm, "algorithm", skip=skip)
    flags.add_section(recipe.algorithm.extra, "algorithm.extra")
    flags.add_section(cluster.perf, "cluster.perf")
    for key, value in cluster.sglang.items() if engines else ():
        flags.add("--sglang-" + key.replace("_", "-"), value, f"cluster.sglang.{key}")
    flags.add_section(dataclasses.asdict(recipe.plugins), "plugins")
    eval_config = _eval_suite(recipe, flags)
    flags.add_section({k: v for k, v in recipe.extra.items() if k != EVAL_SUITE}, "extra")
    if recipe.extra.get("debug_rollout_only") or recipe.algorithm.extra.get("debug_rollout_only"):
        # slime returns before the reward post-process on a rollout-only run; its rollout-log hook sees each batch
        flags.add("custom_rollout_log_function_path", hook_path("rollout_log"), "debug_rollout_only")
    _refuse_pipeline_parallel(recipe)
    lora = _lora_settings(recipe, flags)  # after every other flag: it refuses some of them
    monitor = _monitor(recipe, flags, lora)
    if monitor is not None:
        eval_config = monitor[0]
    if recipe.checkpoint.finetune and not recipe.lora.enabled and "--start-rollout-id" not in flags.origins:
        # Weights only, never resumed: slime starts at loaded iteration + 1, which Megatron's --finetune makes 1, and
        # would skip rollout 0 and its baseline eval (slime/ray/placement_group.py). A LoRA stage resumes instead:
        # its checkpoint loader answers -1 without an adapter checkpoint (aclarena_slime.lora.checkpoint.install).
        flags.add("start_rollout_id", 0, "checkpoint.finetune")
    custom_path = Path(recipe.run_dir) / CUSTOM_CONFIG_NAME
    flags.add("custom_config_path", str(custom_path), "compiler")
    custom = {"aclarena_env_config": {tag: dict(config or {}) for tag, config in recipe.env_config.items()}}
    if recipe.experts:
        custom["aclarena_experts"] = dict(recipe.experts)
    if lora is not None:
        custom["aclarena_lora"] = lora
        custom["aclarena_parity"] = dataclasses.asdict(recipe.parity)
        experts = custom.setdefault("aclarena_experts", {})
        # The adapters this stage trains: its data env's, or with lora.experts (parallel MLE) one per tag.
        trained = (
            {tag: tag for tag in lora["experts"]} if lora.get("experts") else {recipe.data.env: lora["adapter_name"]}
        )
        for tag, adapter in trained.items():
            if experts.get(tag, adapter) != adapter:
                raise RecipeError(
                    f"experts.{tag} names {experts[tag]!r}, but this stage trains adapter {adapter!r} for that env"
                )
            experts[tag] = adapter
        for tag in recipe.monitor.domains if recipe.monitor.active else ():
            experts.setdefault(tag, lora["adapter_name"])  # the policy being trained answers the watched domains
    custom.update(recipe.custom.to_custom_config())
    if monitor is not None:
        custom["aclarena_monitor"] = monitor[1]
    return SlimeCommand(
        train_args=flags.argv(),
        custom_config=custom,
        custom_config_path=custom_path,
        runtime_env=runtime_env(recipe),
        train_script=f"{recipe.paths.slime}/{'train_async.py' if cluster.train_async else 'train.py'}",
        services=dict(recipe.services),
        eval_config=eval_config,
    )


EVAL_SUITE = "eval_suite"  # extra.eval_suite: an eval suite under recipes/ (e.g. eval/mopd.yaml)
EVAL_CONFIG_NAME = "eval_config.yaml"


def _eval_suite(recipe: StageRecipe, flags: _Flags) -> dict[str, Any] | None:
    """slime's ``--eval-config`` for ``extra.eval_suite``: per-dataset samples, temperature and length
    (what the single --eval-* flags cannot say), written beside the custom config."""
    name = recipe.extra.get(EVAL_SUITE)
    if name is None:
        return None
    from aclarena_slime.evaluation import SuiteError
    from aclarena_slime.recipes.eval_config import slime_eval_config

    if recipe.data.eval_prompt_data:
        raise RecipeError("extra.eval_suite replaces data.eval_prompt_data; set one of them")
    try:
        config = slime_eval_config(load_stage_suite(REPO_ROOT / "recipes" / str(name)), recipe.paths.data)
    except (OSError, SuiteError) as exc:
        raise RecipeError(f"extra.eval_suite {name!r}: {exc}") from exc
    flags.add("eval_config", str(Path(recipe.run_dir) / EVAL_CONFIG_NAME), "extra.eval_suite")
    return config


def _monitor(
    recipe: StageRecipe, flags: _Flags, lora: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A monitored stage: its ``--eval-config`` (own eval sets and the earlier domains'), run every
    ``monitor.interval`` rollouts, and the eval-log hook that runs the alarm on the results, with its section."""
    if not recipe.monitor.active:
        return None
    from aclarena_slime.evaluation.suite import SuiteError
    from aclarena_slime.recipes.eval_config import monitor_eval_config

    if recipe.extra.get(EVAL_SUITE):
        raise RecipeError("monitor and extra.eval_suite both write --eval-config; set one of them")
    policy_dir = None
    if lora is not None and lora["sync_mode"] == "disk":  # the PEFT folder the sync rewrites after every step
        policy_dir = f"{lora['sync_dir']}/{lora['adapter_name']}"
    if recipe.monitor.action == "keep" and policy_dir is None:
        raise RecipeError(
            "monitor.action=keep on slime keeps the LoRA adapter the disk sync writes after every step; this stage "
            + (
                "syncs it otherwise (set lora.sync_mode=disk)"
                if lora is not None
                else "trains no adapter (use warn or stop)"
            )
        )
    try:
        config, section = monitor_eval_config(recipe, policy_dir, read_stage)
    except SuiteError as exc:
        raise RecipeError(f"monitor: {exc}") from exc
    flags.add("eval_config", str(Path(recipe.run_dir) / EVAL_CONFIG_NAME), "monitor")
    flags.add("eval_interval", recipe.monitor.interval, "monitor.interval")
    flags.add("custom_eval_rollout_log_function_path", hook_path("monitor_eval_log"), "monitor")
    return config, section


# SFT (the SDFT backbone) has no policy-gradient settings; only the optimiser's carry over.
_SFT_SKIPS = (
    "name", "extra", "advantage_estimator", "use_kl_loss", "kl_loss_coef", "kl_loss_type",
    "entropy_coef", "eps_clip", "eps_clip_high", "use_tis",
)  # fmt: skip


def _data_flags(flags: _Flags, recipe: StageRecipe) -> None:
    data = recipe.data
    flags.add("prompt_data", data.prompt_data, "data.prompt_data")
    flags.add("input_key", data.input_key, "data.input_key")
    flags.add("tool_key", data.tool_key, "data.tool_key")
    flags.add("label_key", data.label_key, "data.label_key")
    flags.add("metadata_key", data.metadata_key, "data.metadata_key")
    flags.add("apply_chat_template", data.apply_chat_template, "data.apply_chat_template")
    flags.add("rollout_shuffle", data.rollout_shuffle, "data.rollout_shuffle")
    if data.eval_prompt_data and not recipe.monitor.active:  # a monitored stage's are in its --eval-config
        pairs = [part for name, path in data.eval_prompt_data.items() for part in (name, path)]
        flags.add("eval_prompt_data", pairs, "data.eval_prompt_data")
        flags.add("eval_interval", data.eval_interval, "data.eval_interval")
        for key in ("n_samples_per_eval_prompt", "eval_temperature", "eval_top_p", "eval_max_response_len"):
            flags.add(key, getattr(data, key), f"data.{key}")


def _lora_settings(recipe: StageRecipe, flags: _Flags) -> dict[str, Any] | None:
    """LoRA hooks on the command line; the adapter's settings (validated) for the custom config."""
    section = recipe.lora
    if not section.enabled:
        return None
    values = {
        **section.to_dict(),
        "adapter_name": section.adapter_name or recipe.data.env,
        "sync_dir": section.sync_dir or f"{recipe.checkpoint.save}/adapters",
    }
    try:
        config = LoraConfig.from_mapping(values)
        config.require_megatron_targets()
    except LoraConfigError as exc:
        raise RecipeError(f"lora: {exc}") from exc
    # The megatron-init hook refuses both at run time (aclarena_slime.slime_edge.lora.check_args): say so first.
    for flag, why in (
        ("--sequence-parallel", "the adapters do not support it"),
        ("--save-hf", "its output is the PEFT adapter"),
    ):
        if flag in flags.origins:
            raise RecipeError(f"lora: {flags.origins[flag]} sets {flag}, which a LoRA stage refuses ({why}); drop it")
    _refuse_hf_load(recipe)
    if config.pause_mode == "retract":
        raise RecipeError(
            "lora.pause_mode=retract: this stage samples from the adapter it syncs, and SGLang's unload waits for "
            "every request holding that adapter, retracted ones included, so the sync would never finish; use abort"
        )
    if config.experts:
        _check_parallel_experts(recipe, config, flags)
    elif "--data-source-path" not in flags.origins:  # resume reads this stage's own prompt position, not the backbone's
        flags.add("data_source_path", hook_path("resumable_data_source"), "lora.enabled")
    # Hook paths and the trainable-parameter pattern as aclarena_slime/slime_edge/lora.py documents them.
    flags.add("custom_model_provider_path", hook_path("lora_model_provider"), "lora.enabled")
    flags.add("custom_megatron_init_path", hook_path("lora_megatron_init"), "lora.enabled")
    flags.add("only_train_params_name_list", [ADAPTER_PARAM_PATTERN], "lora.enabled")
    flags.add("dist_ckpt_strictness", "log_unexpected", "lora.enabled")  # a backbone checkpoint has no adapter keys
    _parity_check(recipe, flags)
    flags.add("--sglang-enable-lora", True, "lora.enabled")
    flags.add("--sglang-max-lora-rank", config.rank, "lora.rank")
    flags.add("--sglang-lora-target-modules", config.hf_target_modules(), "lora.target_modules")
    # Colocated, slime releases all of SGLang's GPU memory, weights included, and brings the weights back
    # only by a full push; an adapter-only sync never pushes the backbone. SGLang's CPU copy restores it
    # (ServerArgs.enable_weights_cpu_backup, sglang 0.5.15.post1 server_args.py).
    if recipe.cluster.colocate and "--sglang-enable-weights-cpu-backup" not in flags.origins:
        flags.add("--sglang-enable-weights-cpu-backup", True, "lora.enabled with cluster.colocate")
    out = config.to_dict()
    out["target_modules"] = list(config.target_modules)
    return out


def _parity_check(recipe: StageRecipe, flags: _Flags) -> None:
    """A LoRA stage checks at every rollout that the engine served the adapter the trainer holds
    (aclarena_slime/slime_edge/parity.py; limits from the recipe's ``parity:``). The rollout-data hook tells
    it which rollout is trained and compares slime's separate recompute where it made one. Without a
    mismatch correction the check also sits in slime's TIS call, which sees the loss's own forward when
    slime reuses it for the old log-probs (one optimiser step per rollout) and returns the loss unweighted;
    with one, the TIS call is the correction's."""
    if "--rollout-data-postprocess-path" not in flags.origins:  # every rollout: its id, or its separate recompute
        flags.add("rollout_data_postprocess_path", hook_path("parity"), "lora.enabled (the parity check)")
    if recipe.algorithm.use_tis:
        return
    if "--custom-tis-function-path" in flags.origins:
        raise RecipeError(
            f"{flags.origins['--custom-tis-function-path']} sets --custom-tis-function-path without "
            "algorithm.use_tis; a LoRA stage uses that call for its parity check: set algorithm.use_tis=true or drop it"
        )
    flags.add("use_tis", True, "lora.enabled (the parity check's TIS call; no correction)")
    flags.add("custom_tis_function_path", hook_path("parity_in_loss"), "lora.enabled")


def _check_parallel_experts(recipe: StageRecipe, config: LoraConfig, flags: _Flags) -> None:
    """Parallel MLE (``lora.experts``): every expert's env is configured, the prompts are drawn
    domain-balanced, and SGLang batches every expert (plus the base) together."""
    missing = [tag for tag in config.experts or () if tag not in recipe.env_config]
    if missing:
        raise RecipeError(
            f"lora.experts {missing} have no env_config.<tag>; add env@env_config.<tag>: <tag> to defaults"
        )
    balanced = hook_path("balanced_data_source")
    source = recipe.plugins.data_source_path
    if source is None:
        flags.add("data_source_path", balanced, "lora.experts")
    elif source != balanced:
        raise RecipeError(
            f"lora.experts: plugins.data_source_path must be {balanced} (domain-balanced prompts), got {source}"
        )
    per_batch = recipe.cluster.sglang.get("max_loras_per_batch")
    if per_batch is not None and int(per_batch) < config.num_adapters + 1:
        raise RecipeError(
            f"cluster.sglang.max_loras_per_batch={per_batch}: {config.num_adapters} experts and the base need "
            f"{config.num_adapters + 1} slots in one batch"
        )


def _check_global_batch(recipe: StageRecipe) -> None:
    """What slime asserts of its optimiser batch, before a job starts: set once, and a rollout holds at least one."""
    rollout = recipe.rollout
    try:
        per_update = rollout.samples_per_update()
    except ValueError as exc:
        raise RecipeError(str(exc)) from exc
    if per_update is None:
        raise RecipeError("slime needs rollout.global_batch_size or rollout.num_steps_per_rollout")
    rollouts = rollout.rollout_batch_size * rollout.n_samples_per_prompt
    if not 1 <= per_update <= rollouts:
        raise RecipeError(
            f"rollout.global_batch_size {per_update} is not between 1 and a rollout's {rollouts} samples "
            f"(rollout_batch_size x n_samples_per_prompt): slime would train no step"
        )


def _check_async(recipe: StageRecipe, engines: bool) -> None:
    """What slime's train_async.py cannot run, refused before any GPU is taken (slime asserts the first)."""
    if recipe.cluster.colocate:
        raise RecipeError(
            "cluster.train_async: slime's train_async.py refuses colocation (assert not args.colocate): "
            "set cluster.colocate=false and cluster.rollout_num_gpus"
        )
    if not engines or recipe.kind == "sft":
        raise RecipeError("cluster.train_async overlaps rollout with training: an SFT stage has no rollout to overlap")
    if recipe.lora.enabled and recipe.lora.staleness_budget is None:
        raise RecipeError(
            "cluster.train_async with lora.enabled needs lora.staleness_budget (e.g. 1): the rollout then runs on "
            "versioned adapters (name@N), so an episode keeps the version it started on while the next sync lands"
        )


def _refuse_pipeline_parallel(recipe: StageRecipe) -> None:
    """The adapter sync and the adapter checkpoint gather one stage's layers: with PP > 1 the first sync would
    die after the model is built, so refuse it here."""
    pp = recipe.cluster.perf.get("pipeline_model_parallel_size") or 1
    if recipe.lora.enabled and int(pp) > 1:
        raise RecipeError(
            f"cluster.perf.pipeline_model_parallel_size={pp}: a LoRA stage supports pipeline parallelism 1 only "
            "(the adapter export behind every sync reads all layers on one pipeline stage, aclarena_slime.lora.export); "
            "use tensor / data parallelism"
        )


def _check_hooks(items: list[tuple[str, Any, str]]) -> None:
    """Every dotted path of ours on the command line is a hook of the table, given to that hook's flag."""
    hooks = {(hook.flag, hook.path) for hook in HOOKS}
    for flag, value, origin in items:
        for dotted in value if isinstance(value, list | tuple) else [value]:
            if isinstance(dotted, str) and dotted.startswith(OUR_PACKAGE) and (flag, dotted) not in hooks:
                known = ", ".join(hook.path for hook in HOOKS if hook.flag == flag) or "none"
                raise RecipeError(f"{origin}: {dotted} is not a slime hook of ours for {flag} (known: {known})")


def is_megatron_checkpoint(path: str | Path) -> bool:
    """slime's own test for ``--load`` (slime/backends/megatron_utils/checkpoint.py ``_is_megatron_checkpoint``):
    anything else is loaded as Hugging Face weights."""
    path = Path(path)
    return (path / "latest_checkpointed_iteration.txt").is_file() or bool(re.fullmatch(r"iter_\d{7}", path.name))


def _refuse_hf_load(recipe: StageRecipe) -> None:
    """slime loads a non-Megatron ``--load`` as HF weights into every parameter of the model, the adapters'
    too, and raises KeyError on the first ``lora_A``: a LoRA stage must start from a torch_dist checkpoint."""
    load = recipe.checkpoint.load
    hf_like = load == recipe.model.hf_checkpoint or (Path(load).is_dir() and not is_megatron_checkpoint(load))
    if hf_like:
        raise RecipeError(
            f"lora: checkpoint.load={load} is a Hugging Face folder, which slime's HF loader cannot load into a "
            "model with adapters (KeyError on lora_A). Convert it with slime's tools/convert_hf_to_torch_dist.py "
            "and set checkpoint.load to the torch_dist folder (the SDFT stage's checkpoint/ for the mle_* recipes)"
        )


def runtime_env(recipe: StageRecipe) -> dict[str, Any]:
    """Ray runtime env: this package and Megatron-LM importable in every actor, plus the recipe's vars.

    The head, the services and loopback bypass any proxy (the rollout calls them from whichever node Ray
    placed it on); Ray keeps the head's address as given (see recipes/addresses.py).
    """
    env = {
        "PYTHONPATH": f"{REPO_ROOT}:{recipe.paths.megatron}",
        # From the authors' scripts (WillDreamer/ACLArena, examples/*/run_*.sh) and slime's own.
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    }
    address = recipe.cluster.ray.address
    if address:
        env.update(ray_cluster_env(address))
    hosts = [address, *(service.host for service in recipe.services.values()), *recipe.cluster.no_proxy]
    bypass = no_proxy_value(hosts, os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or "")
    env.update(no_proxy=bypass, NO_PROXY=bypass)
    env.update({k: str(v) for k, v in recipe.cluster.env_vars.items()})
    return {"env_vars": env}


def _text(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _shell_groups(argv: list[str]) -> list[str]:
    """One flag and its values per line, shell-quoted: what ``--dry-run`` prints."""
    lines: list[str] = []
    for arg in argv:
        quoted = shlex.quote(arg)
        if arg.startswith("--") or not lines or arg == "--":
            lines.append(quoted)
        else:
            lines[-1] += " " + quoted
    return lines


def read_stage(stage: str, env: str) -> StageRollout:
    """What stage ``stage`` (a recipe under ``recipes/``, ``.yaml`` optional) sends for env ``env``: the response
    budget and its mode, the context cap, stop strings and ids, top-k, chat template arguments (slime's rollout
    flags, as compiled) and the env's settings (``aclarena_env_config``)."""
    argv, custom = _compiled_stage(stage if stage.endswith(".yaml") else f"{stage}.yaml")
    envs = custom.get("aclarena_env_config") or {}
    if env not in envs:
        raise ValueError(f"the stage configures no env {env!r} (it has {', '.join(sorted(envs)) or 'none'})")
    kwargs = _flag(argv, "--apply-chat-template-kwargs")
    context = _flag(argv, "--rollout-max-context-len")
    return StageRollout(
        stage=stage,
        max_response_len=int(_flag(argv, "--rollout-max-response-len")[0]),
        budget_mode=str(custom.get("aclarena_response_budget") or "total"),
        max_context_len=int(context[0]) if context else None,
        stop=tuple(_flag(argv, "--rollout-stop")),
        stop_token_ids=tuple(int(t) for t in _flag(argv, "--rollout-stop-token-ids")),
        top_k=int((_flag(argv, "--rollout-top-k") or ["-1"])[0]),
        chat_template_kwargs=json.loads(kwargs[0]) if kwargs else {},
        env_config=dict(envs[env]),
    )


def load_stage_suite(path: str | Path, services: Mapping[str, str] | None = None) -> EvalSuite:
    """:func:`aclarena_slime.evaluation.load_suite` with each ``stage`` dataset bound to its stage's rollout."""
    return load_suite(path, services, stages=read_stage)


@functools.lru_cache(maxsize=16)
def _compiled_stage(recipe_file: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    path = REPO_ROOT / "recipes" / recipe_file
    if not path.is_file():
        raise ValueError(f"no stage recipe {path}")
    command = compile_recipe(load_recipe(path))
    return tuple(command.train_args), dict(command.custom_config)


def _flag(argv: tuple[str, ...], name: str) -> list[str]:
    """The values after ``name`` in a compiled argv (empty when absent)."""
    if name not in argv:
        return []
    values = []
    for arg in argv[argv.index(name) + 1 :]:
        if arg.startswith("--"):
            break
        values.append(arg)
    return values
