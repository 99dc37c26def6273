"""The local stage's builder: the typed stage recipe read once into the parts every phase takes.

:func:`open_session` reads a stage recipe (its sections, and ``cluster.local`` for the backend's own settings) once,
each setting by one line, and builds the parts: where the outputs go, the model folder's source, the engine's
settings, the records' settings, the policy (LoRA expert or full fine-tuning, its optimiser and loss), the GRPO loop's
sampling and evaluation, the warm start's and the SFT stage's settings. Downstream functions take the parts they use,
never the whole recipe. The recipe's defaults are the only ones: the parts' fields have none.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aclarena_slime.local.config import EngineSettings, LocalConfigError, adapter_backbone
from aclarena_slime.local.parts import (
    Backprop,
    KlTerm,
    LossSettings,
    Sampling,
    SftSettings,
    StepSampling,
    TrainSettings,
)
from aclarena_slime.local.records import RecordSettings
from aclarena_slime.local.spec import check_local, steps_per_rollout
from aclarena_slime.local.tiny_model import TinyShape
from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.rollout import Budgets, response_budget_mode

if TYPE_CHECKING:
    from aclarena_slime.distill.balanced_source import ReplaySettings
    from aclarena_slime.local.group_filter import GroupFilter
    from aclarena_slime.recipes.local_section import LocalBackendSettings
    from aclarena_slime.recipes.schema import AlgorithmConfig, DataConfig, RolloutConfig, StageRecipe
    from aclarena_slime.slime_edge.custom import SftFilterSettings


@dataclass(frozen=True)
class StagePaths:
    """Where a stage writes: the adapter (a PEFT folder), or with full fine-tuning the model, the warm-started
    backbone, the metrics."""

    output_dir: Path
    full: bool

    @property
    def adapter_dir(self) -> Path:
        return self.output_dir / "adapter"

    @property
    def policy_dir(self) -> Path:
        """Where the trained policy goes: the adapter, or the fully fine-tuned model."""
        return self.output_dir / "model" if self.full else self.adapter_dir

    @property
    def warm_start_dir(self) -> Path:
        return self.output_dir / "warm_start_model"

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / "metrics.json"


@dataclass(frozen=True)
class ModelSource:
    """The model folder's source: ``"tiny"`` (built in process, of ``shape``, from the stage's seed) or a model
    folder; the torch threads the stage runs with."""

    source: str
    shape: TinyShape
    torch_threads: int | None


@dataclass(frozen=True)
class EngineParts:
    """The embedded engine: its batching, address and served name, and the rollouts' budgets (its seed: the
    stage's)."""

    settings: EngineSettings
    host: str
    port: int
    served_name: str
    budgets: Budgets


@dataclass(frozen=True)
class PolicyParts:
    """The policy a stage trains: a LoRA expert (``lora``, served and saved as ``name``, continuing ``base_adapter``)
    or with ``lora`` None every parameter; its optimiser and loss."""

    name: str
    lora: LoraConfig | None
    base_adapter: str | None
    train: TrainSettings

    @property
    def full(self) -> bool:
        return self.lora is None


@dataclass(frozen=True)
class LoopSettings:
    """The GRPO loop's: steps, the step's sampling, the evaluation's, how many rollouts run at once, where the
    held-out and validation prompts are evaluated, and the progress bar."""

    steps: int
    sampling: StepSampling
    evaluation: Sampling
    max_concurrency: int
    stage_eval: bool
    validation_eval: bool
    validation_interval: int
    dynamic_sampling: bool
    progress: bool


@dataclass(frozen=True)
class WarmStart:
    """The warm start: SFT (``sft``) on the env's gold demos (``demos``: the dotted demo-turns function) kept at
    ``min_reward`` (None: the env's best), into the backbone or the stage's policy (``target``)."""

    demos: str | None
    min_reward: float | None
    target: str
    sft: SftSettings

    @property
    def into_policy(self) -> bool:
        return self.target == "policy"


@dataclass(frozen=True)
class SftStage:
    """An SFT stage's (kind ``sft``): the recipe's filter of the teacher rollouts, the epochs, the optimiser steps
    an epoch."""

    filter: SftFilterSettings | None
    epochs: int
    steps_per_epoch: int


@dataclass(frozen=True)
class LocalSession:
    """A local stage's parts, built once by :func:`open_session`."""

    kind: str
    paths: StagePaths
    model: ModelSource
    engine: EngineParts
    records: RecordSettings
    policy: PolicyParts
    loop: LoopSettings
    warm_start: WarmStart | None  # None: no warm start
    sft: SftStage
    monitor: Mapping[str, Any]
    settings: Mapping[str, Any]  # every resolved setting, as the metrics record them

    @property
    def env(self) -> str:
        """The stage's env tag (``data.env``): its records'."""
        return self.records.env

    @property
    def eval_response_len(self) -> int:
        """The held-out evaluation's response budget: ``data.eval_max_response_len``, else the run's."""
        return self.loop.evaluation.max_new_tokens or self.engine.budgets.max_response_len

    @property
    def seed(self) -> int:
        """The stage's seed (``cluster.local.seed``): its records', its model's, its engine's and its trainer's."""
        return self.records.seed


def open_session(recipe: StageRecipe) -> LocalSession:
    """The builder: a typed stage recipe (``cluster.local`` included) into the stage's parts, each setting read here
    once, by one line. What the local backend cannot run is a :class:`RecipeError` naming the setting (the kinds it
    runs and the keys it reads, :func:`~aclarena_slime.local.spec.check_local`, and the
    values below); an env without gold demos, or a stage continuing ``base_adapter``, runs without the warm start
    (a warning says so)."""
    check_local(recipe)

    algorithm, rollout, data, local, custom = recipe.algorithm, recipe.rollout, recipe.data, recipe.cluster.local, recipe.custom
    env, full, sft_stage = data.env, not recipe.lora.enabled, recipe.kind == "sft"
    if algorithm.use_kl_loss and algorithm.kl_loss_coef <= 0:
        raise RecipeError(f"{recipe.name}: algorithm.use_kl_loss=true needs algorithm.kl_loss_coef > 0")
    try:
        _check(algorithm, rollout, data, sft_stage, full and local.base_adapter)
        warm_steps, backbone = _warm_start_steps(local, env), _backbone(local, recipe.checkpoint.load)
        minibatches = steps_per_rollout(rollout, recipe.name)
        loss = LossSettings(estimator=algorithm.advantage_estimator,
                            per_token=bool(algorithm.extra.get("calculate_per_token_loss", False)),
                            clip_low=algorithm.eps_clip,
                            clip_high=algorithm.eps_clip if algorithm.eps_clip_high is None else algorithm.eps_clip_high,
                            kl=KlTerm(algorithm.kl_loss_coef if algorithm.use_kl_loss else 0.0,
                                      algorithm.kl_loss_type))  # fmt: skip
        groups = Sampling(rollout.n_samples_per_prompt, rollout.rollout_temperature, local.top_p, None)  # the budget
        backprop = Backprop(local.micro_batch_size)
        train = TrainSettings(loss=loss, lr=algorithm.lr, adam_betas=(algorithm.adam_beta1, algorithm.adam_beta2),
                              weight_decay=algorithm.weight_decay, rollouts=groups,
                              updates_per_step=local.updates_per_step, minibatches=minibatches,
                              backprop=backprop)  # fmt: skip
        filters = dataclasses.asdict(custom.aclarena_filters) if custom.aclarena_filters else {}
        group_filter = _group_filter(rollout.dynamic_sampling_filter_path, filters)
        per_round = rollout.over_sampling_batch_size or rollout.rollout_batch_size
        sampling = StepSampling(groups, rollout.rollout_batch_size, per_round, group_filter, local.max_sampling_rounds)
        # avg@n_samples_per_eval_prompt at the evaluation temperature (slime's None: the rollout's)
        evaluation = Sampling(data.n_samples_per_eval_prompt or 1,
                              rollout.rollout_temperature if data.eval_temperature is None else data.eval_temperature,
                              1.0 if data.eval_top_p is None else data.eval_top_p,
                              data.eval_max_response_len)  # fmt: skip
        warm = None
        if warm_steps:
            sft = SftSettings(steps=warm_steps, batch_size=local.warm_start_batch_size, lr=local.warm_start_lr,
                              backprop=backprop, kl=loss.kl)  # fmt: skip
            warm = WarmStart(local.warm_start_demos, local.warm_start_min_reward, local.warm_start_target, sft)
        lora = None if full else LoraConfig.from_mapping({**recipe.lora.to_dict(), "adapter_name": recipe.lora.adapter_name or env})
        shape = TinyShape(local.tiny_vocab_size, local.tiny_hidden_size, local.tiny_layers)
        engine = EngineSettings(local.max_running_requests, local.max_prefill_tokens)
        env_config = dict(recipe.env_config.get(env) or {})
    except RecipeError:
        raise
    except ValueError as exc:  # LocalConfigError, and a part's own check (the loss's, the LoRA's, the tiny model's)
        raise RecipeError(f"{recipe.name} on the local backend: {exc}") from exc
    output_dir = Path(f"{recipe.run_dir}/local")
    sections = ("algorithm", "rollout", "data", "lora", "custom", "monitor")
    return LocalSession(
        kind=recipe.kind,
        paths=StagePaths(output_dir, full),
        model=ModelSource(backbone or adapter_backbone(local.base_adapter) or local.model, shape,
                          local.torch_threads),  # fmt: skip
        engine=EngineParts(engine, local.engine_host, local.engine_port, local.served_name,
                           Budgets(max_response_len=rollout.rollout_max_response_len,
                                   mode=response_budget_mode(custom.aclarena_response_budget))),  # fmt: skip
        records=RecordSettings(
            env=env, env_config=env_config, seed=local.seed, data_path=local.data_path,
            eval_data_path=local.eval_data_path, eval_size=local.eval_size,
            train_prompts=rollout.num_rollout * per_round,  # a round a step; a step of more rounds reads on
            warm_start_records=local.warm_start_records if warm_steps else 0, validation_size=local.validation_size,
            replay=_replay(custom.aclarena_replay, env, recipe.env_config),
        ),  # fmt: skip
        policy=PolicyParts(lora.adapter_name if lora else env, lora, local.base_adapter, train),
        loop=LoopSettings(rollout.num_rollout, sampling, evaluation, local.max_concurrency, local.stage_eval,
                          local.validation_eval, local.validation_interval, group_filter is not None
                          or rollout.over_sampling_batch_size is not None, local.progress),  # fmt: skip
        warm_start=warm,
        sft=SftStage(custom.aclarena_sft_filter if sft_stage else None,
                     int(algorithm.extra.get("num_epoch") or 1) if sft_stage else 1, minibatches),  # fmt: skip
        monitor=recipe.monitor.to_dict() if recipe.monitor.active else {},
        # every resolved setting, as the metrics record it: the recipe's sections the local backend reads, and
        # cluster.local as the stage runs it (the warm start it runs, the backbone it continues)
        settings={"name": recipe.name, "kind": recipe.kind, "env": env, "output_dir": str(output_dir),
                  "env_config": env_config, **{name: dataclasses.asdict(getattr(recipe, name)) for name in sections},
                  "local": {**dataclasses.asdict(local), "warm_start_steps": warm_steps, "backbone": backbone}},
    )  # fmt: skip


def _warm_start_steps(local: LocalBackendSettings, env: str) -> int:
    """``cluster.local.warm_start_steps``, or 0 with a warning where the stage cannot warm-start: an env without
    gold demos (no ``warm_start_demos``), a stage that continues ``base_adapter`` (the warm start would change the
    backbone under the adapter it continues)."""
    if local.warm_start_steps and not local.warm_start_demos:
        warnings.warn(
            f"cluster.local: no warm_start_demos for env {env!r} (recipes/env/local/{env}.yaml); "
            "this stage runs without the SFT warm start (GRPO from the base model)",
            stacklevel=3,
        )
        return 0
    if local.warm_start_steps and local.base_adapter:
        warnings.warn(
            "cluster.local: this stage continues base_adapter; it runs without the SFT warm start "
            "(which would change the backbone under the adapter)",
            stacklevel=3,
        )
        return 0
    return local.warm_start_steps


def _backbone(local: LocalBackendSettings, load: str | None) -> str | None:
    """``cluster.local.backbone``, else the model a previous local stage fine-tuned in full (``checkpoint.load``, a
    Hugging Face folder)."""
    if local.backbone is None and isinstance(load, str) and (Path(load) / "config.json").is_file():
        return load
    return local.backbone


def _check(algorithm: AlgorithmConfig, rollout: RolloutConfig, data: DataConfig, sft: bool, full_on_adapter: Any) -> None:
    """What the recipe's schema leaves to the local backend: the values its trainer, sampler and evaluation take."""
    if not data.env or not isinstance(data.env, str):
        raise LocalConfigError(f"env must be a non-empty environment tag, got {data.env!r}")
    if algorithm.lr <= 0:
        raise LocalConfigError(f"lr must be positive, got {algorithm.lr!r}")
    if rollout.rollout_temperature <= 0:
        raise LocalConfigError(
            f"temperature must be positive (sampling is what RL learns from), got {rollout.rollout_temperature!r}"
        )
    if data.eval_temperature is not None and data.eval_temperature < 0:
        raise LocalConfigError(f"eval_temperature must be >= 0 (0 is greedy), got {data.eval_temperature!r}")
    if data.eval_top_p is not None and not 0.0 < data.eval_top_p <= 1.0:
        raise LocalConfigError(f"eval_top_p must be in (0, 1], got {data.eval_top_p!r}")
    if data.eval_max_response_len is not None and data.eval_max_response_len < 1:
        raise LocalConfigError(f"eval_max_response_len must be positive, got {data.eval_max_response_len!r}")
    if data.n_samples_per_eval_prompt is not None and data.n_samples_per_eval_prompt < 0:
        raise LocalConfigError(f"eval_samples must be a positive integer, got {data.n_samples_per_eval_prompt!r}")
    epochs = algorithm.extra.get("num_epoch") or 1
    if sft and (not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1):
        raise LocalConfigError(f"sft_epochs must be a positive integer, got {epochs!r}")
    high = algorithm.eps_clip if algorithm.eps_clip_high is None else algorithm.eps_clip_high
    if algorithm.eps_clip < 0 or high < 0:
        raise LocalConfigError(f"clip eps must be non-negative, got {algorithm.eps_clip!r}/{high!r}")
    if algorithm.weight_decay < 0 or not (0 <= algorithm.adam_beta1 < 1 and 0 <= algorithm.adam_beta2 < 1):
        raise LocalConfigError(
            f"AdamW needs weight_decay >= 0 and betas in [0, 1), got {algorithm.weight_decay!r}, "
            f"({algorithm.adam_beta1!r}, {algorithm.adam_beta2!r})"
        )
    if full_on_adapter:
        raise LocalConfigError("full fine-tuning continues a model folder (backbone), not base_adapter")
    per_round = rollout.over_sampling_batch_size
    if per_round is not None and per_round < rollout.rollout_batch_size:
        raise LocalConfigError(
            f"over_sampling_prompts={per_round} is below prompts_per_step={rollout.rollout_batch_size} "
            "(rollout.over_sampling_batch_size must be at least rollout.rollout_batch_size, as slime requires)"
        )


def _group_filter(path: str | None, settings: Mapping[str, Any]) -> GroupFilter | None:
    """The recipe's group filter (``rollout.dynamic_sampling_filter_path``) over ``custom.aclarena_filters``."""
    from aclarena_slime.local.group_filter import GroupFilter, GroupFilterError

    if path is None:
        return None
    try:
        return GroupFilter.named(path, settings)
    except GroupFilterError as exc:
        raise LocalConfigError(str(exc)) from exc


def _replay(replay: ReplaySettings | None, env: str, env_configs: Mapping[str, Any]) -> dict[str, Any]:
    """The replay baseline (``custom.aclarena_replay``, :func:`aclarena_slime.local.records.replay_mixture`): its
    settings plus the replayed ``domains`` and their env settings; empty: the stage's own records only."""
    if replay is None or not replay.enabled or not replay.data:
        return {}
    return {
        **{k: v for k, v in dataclasses.asdict(replay).items() if k != "data"},
        "current": replay.current or env,
        "domains": list(replay.data),
        "env_config": {tag: dict(env_configs.get(tag) or {}) for tag in replay.data},
    }
