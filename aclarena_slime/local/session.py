"""The local stage's builder: its settings read once into the parts every phase takes.

:func:`open_session` reads a stage's settings (:class:`~aclarena_slime.local.config.LocalStageConfig`, the recipe
and ``cluster.local`` as :mod:`.spec` maps them) once and builds the parts: where the outputs go, the model folder's
source, the engine's settings, the records' settings, the policy (LoRA expert or full fine-tuning, its optimiser and
loss), the GRPO loop's sampling and evaluation, the warm start's and the SFT stage's settings. Downstream functions
take the parts they use, never the whole settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aclarena_slime.local.config import EngineSettings, LocalStageConfig
from aclarena_slime.local.losses import LossSettings
from aclarena_slime.local.records import RecordSettings
from aclarena_slime.local.rollouts import Sampling, StepSampling
from aclarena_slime.local.sft import SftSettings
from aclarena_slime.local.tiny_model import TinyShape
from aclarena_slime.local.trainer import TrainSettings
from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.rollout import Budgets

if TYPE_CHECKING:
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
    """The model folder's source: ``"tiny"`` (built in process, of ``shape``) or a model folder; the seed and
    torch threads the stage runs with."""

    source: str
    shape: TinyShape
    seed: int
    torch_threads: int | None


@dataclass(frozen=True)
class EngineParts:
    """The embedded engine: its batching, address, served name and seed, and the rollouts' budgets."""

    settings: EngineSettings
    host: str
    port: int
    served_name: str
    seed: int
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

    env: str
    kind: str
    seed: int
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


def open_session(cfg: LocalStageConfig) -> LocalSession:
    """The builder: each part from the stage's settings, each setting read here once."""
    from aclarena_slime.evaluation.suite import HELD_OUT_SEED
    from aclarena_slime.local.group_filter import GroupFilter

    full = cfg.full_finetune
    loss = LossSettings(estimator=cfg.advantage_estimator, per_token=cfg.per_token_loss, clip_low=cfg.clip_eps_low,
                        clip_high=cfg.clip_eps_high, kl_coef=cfg.kl_coef, kl_loss_type=cfg.kl_loss_type)  # fmt: skip
    train = TrainSettings(loss=loss, lr=cfg.lr, adam_betas=(cfg.adam_beta1, cfg.adam_beta2),
                          weight_decay=cfg.weight_decay, temperature=cfg.temperature,
                          updates_per_step=cfg.updates_per_step, minibatches=cfg.steps_per_rollout,
                          micro_batch_size=cfg.micro_batch_size)  # fmt: skip
    groups = Sampling(cfg.samples_per_prompt, cfg.temperature, cfg.top_p, cfg.max_response_len, cfg.seed)
    group_filter = GroupFilter.named(cfg.group_filter, cfg.filter_settings) if cfg.group_filter else None
    sampling = StepSampling(groups, cfg.prompts_per_step, cfg.prompts_per_round, group_filter, cfg.max_sampling_rounds)
    # avg@eval_samples at the evaluation temperature, seeded apart from training's
    evaluation = Sampling(cfg.eval_samples, cfg.eval_temperature, cfg.eval_top_p, cfg.eval_budget,
                          cfg.seed + HELD_OUT_SEED)  # fmt: skip
    warm = None
    if cfg.warm_start_steps:
        sft = SftSettings(steps=cfg.warm_start_steps, batch_size=cfg.warm_start_batch_size, lr=cfg.warm_start_lr,
                          micro_batch_size=cfg.micro_batch_size, kl_coef=cfg.kl_coef,
                          kl_loss_type=cfg.kl_loss_type)  # fmt: skip
        warm = WarmStart(cfg.warm_start_demos, cfg.warm_start_min_reward, cfg.warm_start_target, sft)
    return LocalSession(
        env=cfg.env,
        kind=cfg.kind,
        seed=cfg.seed,
        paths=StagePaths(Path(cfg.output_dir), full),
        model=ModelSource(cfg.model_source, TinyShape(cfg.tiny_vocab_size, cfg.tiny_hidden_size, cfg.tiny_layers),
                          cfg.seed, cfg.torch_threads),  # fmt: skip
        engine=EngineParts(cfg.engine_settings, cfg.engine_host, cfg.engine_port, cfg.served_name, cfg.seed,
                           Budgets(max_response_len=cfg.max_response_len, mode=cfg.response_budget)),  # fmt: skip
        records=RecordSettings(
            env=cfg.env, env_config=cfg.env_config, served_name=cfg.served_name, seed=cfg.seed,
            data_path=cfg.data_path, eval_data_path=cfg.eval_data_path, eval_size=cfg.eval_size,
            train_prompts=cfg.steps * cfg.prompts_per_round,  # a round a step; a step of more rounds reads on
            warm_start_records=cfg.warm_start_records if cfg.warm_start_steps else 0,
            validation_size=cfg.validation_size, prompts_per_step=cfg.prompts_per_step, replay=cfg.replay,
        ),  # fmt: skip
        policy=PolicyParts(cfg.expert_name, None if full else cfg.lora, cfg.base_adapter, train),
        loop=LoopSettings(cfg.steps, sampling, evaluation, cfg.max_concurrency, cfg.stage_eval, cfg.validation_eval,
                          cfg.validation_interval, cfg.dynamic_sampling, cfg.progress),  # fmt: skip
        warm_start=warm,
        sft=SftStage(cfg.sft_filter, cfg.sft_epochs, cfg.steps_per_rollout),
        monitor=cfg.monitor,
        settings=cfg.to_dict(),
    )
