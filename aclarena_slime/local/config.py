"""The settings of one local stage: one typed dataclass, validated on construction.

:func:`aclarena_slime.local.spec.local_config` maps a stage recipe onto
:class:`LocalStageConfig` (the recipe's own sections, plus ``cluster.local`` for the backend's own
settings); the stage's builder (:func:`aclarena_slime.local.session.open_session`) reads it into the parts the
phases take.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aclarena_slime.kl import KL_TYPES
from aclarena_slime.lora.config import LoraConfig, LoraConfigError
from aclarena_slime.plugin.settings import from_mapping
from aclarena_slime.recipes.local_section import TINY_MODEL, LocalBackendSettings, LocalConfigError  # noqa: F401 - TINY_MODEL: the stage's readers import it from here

if TYPE_CHECKING:
    from aclarena_slime.slime_edge.custom import SftFilterSettings

# The rollout's and the slime edge's modules (response_budget_mode, SftFilterSettings) load aiohttp: they are
# imported where a stage's settings are checked, so `aclarena --help` (which reads EngineSettings) stays light.

KINDS = ("rl", "sft")  # GRPO (after an optional warm start), or an SFT warm-start stage


def default_lora() -> LoraConfig:
    """The local expert when the recipe trains none of its own: rank 8, alpha 16 on the four linears."""
    return LoraConfig(rank=8, alpha=16.0, adapter_name=None)


@dataclass(frozen=True)
class EngineSettings:
    """How much the embedded engine batches (SGLang's server-argument names).

    ``max_running_requests``: sequences decoding together, one forward per step for all of them; more
    wait in a queue. ``max_prefill_tokens``: the most prompt tokens one prefill takes (real tokens, as
    SGLang counts them: the prefill is packed), so a burst of long prompts joins over a few steps
    instead of stalling the decode; a longer prompt still runs, alone. The defaults suit a 2-core laptop and the tiny models: one GRPO step of
    8 prompts x 8 samples decodes as one batch (``docs/local-engine.md`` has the measurements).
    """

    max_running_requests: int = LocalBackendSettings.max_running_requests
    max_prefill_tokens: int = LocalBackendSettings.max_prefill_tokens

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "max_prefill_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LocalConfigError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class LocalStageConfig(LocalBackendSettings):
    """One stage on the local backend: env, data, model, the phases (warm start, SFT or GRPO), LoRA or full
    fine-tuning, the KL term, outputs.

    ``model`` is ``"tiny"`` (a Qwen3-shaped model built in-process, no download) or a Hugging Face
    model directory. ``data_path=None`` uses the env's generated ``demo_records``; the evaluation
    set is ``eval_data_path`` or, when absent, ``eval_size`` further demo records (other seed).
    ``base_adapter`` starts the expert from an existing PEFT directory; ``backbone`` replaces the
    base model (a merged/SDFT checkpoint) and wins over ``model`` — both for chaining stages.
    Training records never share a prompt with the evaluation records (see ``stage.stage_records``).

    Warm start (the paper's stage shape, SFT then RL): with ``warm_start_steps`` > 0 the backbone is
    first fine-tuned in full on gold demo trajectories — ``warm_start_records`` training records, their
    model turns written by ``warm_start_demos`` (a dotted path to the env plugin's
    ``turns(record) -> list[str]``), replayed through the env and kept when they score at least
    ``warm_start_min_reward`` (None: the env's best reward) — and the LoRA expert is trained by GRPO
    on top.
    """

    env: str
    output_dir: str
    kind: str = "rl"  # rl: GRPO (after the warm start, if any); sft: teacher rollouts, filter, SFT
    sft_filter: SftFilterSettings | None = None  # kind "sft": which teacher rollouts are kept (the recipe's)
    sft_epochs: int = 1  # kind "sft": SFT steps over the kept rollouts
    full_finetune: bool = False  # lora.enabled=false: every parameter trains (lora is then unused)
    kl_coef: float = 0.0  # > 0: the KL term to the policy the stage started from (algorithm.use_kl_loss)
    kl_loss_type: str = "low_var_kl"
    advantage_estimator: str = "grpo"  # grpo: a per-token ratio; gspo: a sequence-level one (local/losses.py)
    per_token_loss: bool = False  # slime's calculate_per_token_loss; false: the per-sample mean (slime's default)
    weight_decay: float = 0.0  # AdamW's
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    env_config: Mapping[str, Any] = field(default_factory=dict)
    steps: int = 4
    prompts_per_step: int = 4
    samples_per_prompt: int = 4
    lr: float = 1e-3
    max_response_len: int = 64
    response_budget: str = "total"  # max_response_len bounds the whole trajectory, or each model turn
    temperature: float = 1.0
    # The expert: LoraConfig (a mapping is read as one); Megatron target names become their HF projections.
    # Its adapter_name is the expert's served name (None: the env tag).
    lora: LoraConfig = field(default_factory=default_lora)
    eval_temperature: float = 0.0  # 0: greedy evaluation
    eval_top_p: float = 1.0
    eval_samples: int = 1  # samples per held-out (and validation) prompt; the reward is their mean (avg@n)
    eval_max_response_len: int | None = None  # None: max_response_len
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    # Dynamic sampling (aclarena_slime.local.group_filter): the recipe's group filter (a dotted path; None: every
    # group trains), the prompts a sampling round rolls out (None: prompts_per_step) and the filter's settings
    # (custom.aclarena_filters).
    group_filter: str | None = None
    over_sampling_prompts: int | None = None
    filter_settings: Mapping[str, Any] = field(default_factory=dict)
    # Optimiser steps per GRPO step (an SFT stage: per epoch), each on a contiguous part of its rollouts, as slime
    # trains a rollout (rollout.num_steps_per_rollout, or the rollouts over rollout.global_batch_size).
    steps_per_rollout: int = 1
    # The forgetting monitor (aclarena_slime.evaluation.monitor): the recipe's monitor section, MonitorSettings
    # fields (``domains``: the earlier env tags); the curriculum fills it. Empty: no monitor.
    monitor: Mapping[str, Any] = field(default_factory=dict)
    # The replay baseline (aclarena_slime.local.records.replay_mixture): ReplaySettings fields plus ``domains`` and their
    # ``env_config``; the curriculum fills it. Empty: the stage's own records only.
    replay: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()  # the backend's own settings (cluster.local)
        if not self.env or not isinstance(self.env, str):
            raise LocalConfigError(f"env must be a non-empty environment tag, got {self.env!r}")
        if not self.output_dir:
            raise LocalConfigError("output_dir must name a folder for the adapter and metrics")
        for name in (
            "steps",
            "prompts_per_step",
            "samples_per_prompt",
            "max_response_len",
            "sft_epochs",
            "eval_samples",
            "steps_per_rollout",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LocalConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.lr <= 0:
            raise LocalConfigError(f"lr must be positive, got {self.lr!r}")
        if self.temperature <= 0:
            raise LocalConfigError(
                f"temperature must be positive (sampling is what RL learns from), got {self.temperature!r}"
            )
        if self.eval_temperature < 0:
            raise LocalConfigError(f"eval_temperature must be >= 0 (0 is greedy), got {self.eval_temperature!r}")
        if not 0.0 < self.eval_top_p <= 1.0:
            raise LocalConfigError(f"eval_top_p must be in (0, 1], got {self.eval_top_p!r}")
        if self.eval_max_response_len is not None and self.eval_max_response_len < 1:
            raise LocalConfigError(f"eval_max_response_len must be positive, got {self.eval_max_response_len!r}")
        from aclarena_slime.rollout import response_budget_mode

        try:
            object.__setattr__(self, "response_budget", response_budget_mode(self.response_budget))
        except ValueError as exc:
            raise LocalConfigError(str(exc)) from exc
        if isinstance(self.lora, Mapping):
            try:
                values = {**default_lora().to_dict(), **self.lora}  # over the local default, not the paper's
                object.__setattr__(self, "lora", LoraConfig.from_mapping(values))
            except LoraConfigError as exc:
                raise LocalConfigError(str(exc)) from exc
        if not isinstance(self.lora, LoraConfig):
            raise LocalConfigError(f"lora must be LoRA settings (a mapping), got {type(self.lora).__name__}")
        if self.clip_eps_low < 0 or self.clip_eps_high < 0:
            raise LocalConfigError(f"clip eps must be non-negative, got {self.clip_eps_low!r}/{self.clip_eps_high!r}")
        self._check_warm_start()
        self._check_policy()
        self._check_sampling()
        if not isinstance(self.env_config, Mapping):
            raise LocalConfigError(f"env_config must be a mapping, got {type(self.env_config).__name__}")

    def _check_warm_start(self) -> None:
        steps = self.warm_start_steps
        if steps and not self.warm_start_demos:
            raise LocalConfigError(
                "warm_start_steps > 0 needs warm_start_demos, the dotted path of the env's demo-turns function"
            )
        if steps and self.base_adapter:
            raise LocalConfigError(
                "warm_start_steps > 0 with a base_adapter: the warm start would change the backbone under the "
                "adapter it continues; set warm_start_steps=0 for a chained stage"
            )

    def _check_policy(self) -> None:
        if self.kind not in KINDS:
            raise LocalConfigError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if isinstance(self.sft_filter, Mapping):
            from aclarena_slime.slime_edge.custom import SftFilterSettings

            try:
                object.__setattr__(self, "sft_filter", SftFilterSettings(**dict(self.sft_filter)))
            except (TypeError, ValueError) as exc:
                raise LocalConfigError(f"sft_filter: {exc}") from exc
        if self.kind == "sft" and self.sft_filter is None:
            raise LocalConfigError("kind 'sft' needs sft_filter (the recipe's custom.aclarena_sft_filter)")
        if self.kl_coef < 0:
            raise LocalConfigError(f"kl_coef must be >= 0, got {self.kl_coef!r}")
        if self.kl_loss_type not in KL_TYPES:
            raise LocalConfigError(f"kl_loss_type must be one of {', '.join(KL_TYPES)}, got {self.kl_loss_type!r}")
        if self.weight_decay < 0 or not (0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1):
            raise LocalConfigError(
                f"AdamW needs weight_decay >= 0 and betas in [0, 1), got {self.weight_decay!r}, "
                f"({self.adam_beta1!r}, {self.adam_beta2!r})"
            )
        if self.full_finetune and self.base_adapter:
            raise LocalConfigError("full fine-tuning continues a model folder (backbone), not base_adapter")

    def _check_sampling(self) -> None:
        per_round = self.over_sampling_prompts
        if per_round is not None and (isinstance(per_round, bool) or not isinstance(per_round, int) or per_round < 1):
            raise LocalConfigError(f"over_sampling_prompts must be a positive integer or None, got {per_round!r}")
        if per_round is not None and per_round < self.prompts_per_step:
            raise LocalConfigError(
                f"over_sampling_prompts={per_round} is below prompts_per_step={self.prompts_per_step} "
                "(rollout.over_sampling_batch_size must be at least rollout.rollout_batch_size, as slime requires)"
            )
        if self.group_filter is not None:
            from aclarena_slime.local.group_filter import GroupFilter, GroupFilterError

            try:
                GroupFilter.named(self.group_filter, self.filter_settings)
            except GroupFilterError as exc:
                raise LocalConfigError(str(exc)) from exc

    @property
    def dynamic_sampling(self) -> bool:
        """Whether a GRPO step samples as slime's dynamic sampling does (a group filter, or over-sampling)."""
        return self.group_filter is not None or self.over_sampling_prompts is not None

    @property
    def prompts_per_round(self) -> int:
        """The prompts one sampling round rolls out."""
        return self.over_sampling_prompts or self.prompts_per_step

    @property
    def policy_dir(self) -> Path:
        """Where the trained policy goes: the adapter (a PEFT folder), or the fully fine-tuned model."""
        return Path(self.output_dir) / "model" if self.full_finetune else self.adapter_dir

    @property
    def engine_settings(self) -> EngineSettings:
        """What the stage's embedded engine runs with."""
        return EngineSettings(self.max_running_requests, self.max_prefill_tokens)

    @property
    def warm_start_dir(self) -> Path:
        """The warm-started backbone (a Hugging Face model folder)."""
        return Path(self.output_dir) / "warm_start_model"

    @property
    def expert_name(self) -> str:
        """The name the adapter is served and saved under."""
        return self.lora.adapter_name or self.env

    @property
    def eval_budget(self) -> int:
        """Tokens of one held-out evaluation rollout."""
        return self.eval_max_response_len or self.max_response_len

    @property
    def adapter_dir(self) -> Path:
        return Path(self.output_dir) / "adapter"

    @property
    def metrics_path(self) -> Path:
        return Path(self.output_dir) / "metrics.json"

    @property
    def model_source(self) -> str:
        """What the stage loads: the chained backbone when given, else the backbone ``base_adapter`` was
        trained on (its ``adapter_config.json`` records it; an adapter only means something on its own
        base), else ``model``."""
        return self.backbone or adapter_backbone(self.base_adapter) or self.model

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["env_config"] = dict(self.env_config)
        out["monitor"] = dict(self.monitor)
        out["replay"] = dict(self.replay)
        out["lora"] = self.lora.to_dict()
        out["sft_filter"] = asdict(self.sft_filter) if self.sft_filter is not None else None
        return out

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> LocalStageConfig:
        """Build from a plain mapping (a recipe section), naming any key the dataclass does not know."""
        return from_mapping(cls, values, "local-stage settings", LocalConfigError)


def adapter_backbone(adapter: str | None) -> str | None:
    """The model folder a PEFT adapter was trained on, when its config names one that exists here."""
    if not adapter:
        return None
    config = Path(adapter) / "adapter_config.json"
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError):
        return None
    return base if isinstance(base, str) and (Path(base) / "config.json").is_file() else None
