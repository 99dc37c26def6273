"""The typed shape of a stage recipe: what Hydra composes is merged into these dataclasses.

Field names of the flag-carrying sections are slime's ``args`` names (``kl_loss_coef`` is
``--kl-loss-coef``), so the compiler maps them mechanically and each value is declared once. A key that
is not a field is an error (OmegaConf struct mode), naming the key. Free-form flag maps (``extra``,
``model.architecture``, ``cluster.perf``, ``cluster.sglang``) are checked flag by flag against
``known_flags.txt`` by the compiler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from aclarena_slime.evaluation.monitor import MonitorSettings
from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.parity import ParitySettings
from aclarena_slime.recipes.local_section import LocalBackendSettings
from aclarena_slime.slime_edge import path as hook_path
from aclarena_slime.slime_edge.custom import CustomConfig

BACKENDS = ("auto", "slime", "local")
KINDS = ("rl", "sft", "mopd")


@dataclass
class PathsConfig:
    root: str = MISSING  # everything below defaults to folders under it
    models: str = MISSING
    data: str = MISSING
    runs: str = MISSING
    megatron: str = "/root/Megatron-LM"  # slime's image keeps Megatron-LM here (docker/Dockerfile)
    slime: str = "/root/slime"


@dataclass
class ModelConfig:
    name: str = MISSING
    hf_checkpoint: str = MISSING  # tokenizer + HF config (and SGLang's initial weights)
    torch_dist: str = MISSING  # the same weights as a Megatron torch_dist checkpoint (--load of a first stage)
    architecture: dict[str, Any] = field(default_factory=dict)  # Megatron model flags


@dataclass
class RayConfig:
    # The head's address, which every node and slime's training ranks use (Ray's node IP is slime's master
    # address). null: loopback on one node; on several nodes this machine's routable address
    # (aclarena_slime.recipes.addresses); a loopback address on several nodes is refused.
    address: str | None = None
    port: int = 6379
    dashboard_port: int = 8265
    temp_dir: str | None = None


@dataclass
class ClusterConfig:
    name: str = MISSING
    backend: str = "auto"  # auto: slime when slime and a GPU are present, else local
    actor_num_nodes: int = 1
    actor_num_gpus_per_node: int = 8
    num_gpus_per_node: int = 8
    rollout_num_gpus: int | None = None  # None: colocated with the actor
    colocate: bool = True
    # Run slime's train_async.py: the next rollout overlaps this step's training (one step off-policy).
    # Slime refuses colocation there; a LoRA stage needs lora.staleness_budget (versioned adapters).
    train_async: bool = False
    rollout_num_gpus_per_engine: int = 8
    perf: dict[str, Any] = field(default_factory=dict)  # parallelism / memory flags
    sglang: dict[str, Any] = field(default_factory=dict)  # --sglang-<key> flags
    env_vars: dict[str, str] = field(default_factory=dict)  # into the Ray job's runtime env
    # Further hosts / subnets the job reaches without a proxy (e.g. the nodes' 10.0.0.0/8); the head, the
    # services and loopback are always in the job's no_proxy.
    no_proxy: list[str] = field(default_factory=list)
    ray: RayConfig = field(default_factory=RayConfig)
    # The backend profile this cluster applies over the recipe (recipes/profile/<profile>.yaml and the stage
    # env's recipes/env/<profile>/<tag>.yaml; see aclarena_slime.recipes.compose); None: the recipe as it is.
    profile: str | None = None
    # The local backend's own settings (model, threads, engine, warm start); the recipe's other sections give
    # the rest of a local stage's (aclarena_slime.local.spec).
    local: LocalBackendSettings = field(default_factory=LocalBackendSettings)


@dataclass
class AlgorithmConfig:
    name: str = MISSING
    advantage_estimator: str = "grpo"
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "low_var_kl"
    entropy_coef: float = 0.0
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    use_tis: bool = False
    optimizer: str = "adam"
    lr: float = 1e-6
    lr_decay_style: str = "constant"
    min_lr: float | None = None
    lr_warmup_fraction: float | None = None
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    extra: dict[str, Any] = field(default_factory=dict)  # any further slime / Megatron flags


@dataclass
class LoraSection(LoraConfig):
    """The recipe's ``lora:``: the one LoRA settings type (:class:`~aclarena_slime.lora.config.LoraConfig`,
    validated when the recipe is built) plus whether the stage trains adapters at all.

    In a recipe ``adapter_name`` None is the data's env tag, and ``sync_dir`` None is
    ``<checkpoint.save>/adapters`` (every SGLang server reads it: on several nodes a shared filesystem).
    """

    enabled: bool = False
    adapter_name: str | None = None


@dataclass
class ServiceConfig:
    """A process the stage needs beside slime, started by the launcher on the head node.

    ``command`` may use ``{host}`` and ``{port}``; ``ready_path`` is polled with GET until it answers.
    ``host`` null means the Ray head's address (loopback on one node, the routable address on several, so
    the RolloutManager reaches it from whichever node Ray placed it on).

    The launcher keeps watching it for the whole job (:class:`aclarena_slime.launcher.services.ServiceWatch`):
    every ``check_interval_s`` it polls ``ready_path``; a service whose process exited, or that has not
    answered for ``unready_timeout_s``, is restarted up to ``max_restarts`` times in a job, and after that the
    job is stopped naming the service and its last log lines (a dead retriever otherwise aborts every
    episode and the stage trains on nothing). ``env`` is added to the process's environment (thread caps).
    """

    command: list[str] = MISSING
    host: str | None = None
    port: int = MISSING
    ready_path: str = "/health"
    ready_timeout_s: float = 1800.0
    url: str = "http://${.host}:${.port}"
    env: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 2
    check_interval_s: float = 10.0
    unready_timeout_s: float = 120.0


@dataclass
class DataConfig:
    env: str = MISSING  # env tag = metadata.env of the records
    prompt_data: str = MISSING
    input_key: str = "prompt"
    tool_key: str | None = None  # chat-format SFT data: the records' tool schemas, rendered by the template
    label_key: str | None = "label"
    metadata_key: str = "metadata"
    apply_chat_template: bool = False  # our generate renders the chat itself
    rollout_shuffle: bool = True
    eval_prompt_data: dict[str, str] = field(default_factory=dict)  # name -> JSONL
    eval_interval: int | None = None
    # Evaluation during training (slime's flags; None: slime's default, the rollout's setting).
    n_samples_per_eval_prompt: int | None = None
    eval_temperature: float | None = None
    eval_top_p: float | None = None
    eval_max_response_len: int | None = None


@dataclass
class RolloutConfig:
    num_rollout: int = 300
    rollout_batch_size: int = 64
    n_samples_per_prompt: int = 8
    # Samples per optimiser step: a rollout of rollout_batch_size x n_samples_per_prompt trains in that many
    # contiguous steps. slime's other way to say it, num_steps_per_rollout, sets it when it is null (both set
    # must agree, as slime asserts).
    global_batch_size: int | None = 512
    num_steps_per_rollout: int | None = None
    rollout_max_response_len: int = 4096
    # The whole context, prompt + response (slime's flag; the agent loop caps multi-turn episodes with it).
    rollout_max_context_len: int | None = None
    rollout_temperature: float = 1.0
    over_sampling_batch_size: int | None = None
    dynamic_sampling_filter_path: str | None = None
    balance_data: bool = True

    def __post_init__(self) -> None:
        """Counts and lengths are positive: a negative one is a typo, refused naming its key (not as an optimiser batch
        that does not fit, which is what the batch check would say of it). ``global_batch_size`` has that check."""
        counts = ("num_rollout", "rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len")
        optional = ("num_steps_per_rollout", "rollout_max_context_len", "over_sampling_batch_size")
        for name in counts + optional:
            value = getattr(self, name)
            if (value is not None or name in counts) and not (isinstance(value, int) and value >= 1):
                raise ValueError(f"rollout.{name} must be positive, got {value}")

    def samples_per_update(self) -> int | None:
        """slime's global batch: ``global_batch_size``, or the rollout's samples over ``num_steps_per_rollout``
        (slime's rule, ``slime/utils/arguments.py``); None when neither is set."""
        if self.num_steps_per_rollout is None:
            return self.global_batch_size
        derived = self.rollout_batch_size * self.n_samples_per_prompt // self.num_steps_per_rollout
        if self.global_batch_size is not None and self.global_batch_size != derived:
            raise ValueError(
                f"rollout.global_batch_size {self.global_batch_size} is not rollout_batch_size "
                f"{self.rollout_batch_size} x n_samples_per_prompt {self.n_samples_per_prompt} // "
                f"num_steps_per_rollout {self.num_steps_per_rollout} = {derived}; set one of them (slime asserts this)"
            )
        return derived


@dataclass
class CheckpointConfig:
    load: str = MISSING  # Megatron torch_dist folder the stage starts from
    ref_load: str = "${.load}"
    # Which saved iteration of ``load`` (slime's --ckpt-step; the reference model follows it); None: the latest.
    ckpt_step: int | None = None
    save: str = MISSING
    # --save-hf: an HF export of the trained weights, rewritten at every save (what SGLang serves for
    # stages built on this one). One folder: slime's {rollout_id} template is refused by the compiler.
    save_hf: str | None = None
    save_interval: int = 20
    finetune: bool = True  # weights only: the iteration restarts at 0 in each stage
    no_load_optim: bool = False
    no_load_rng: bool = False

    def __post_init__(self) -> None:
        if self.ckpt_step is not None and self.ckpt_step < 1:
            raise ValueError(f"checkpoint.ckpt_step must be a saved iteration (>= 1), got {self.ckpt_step}")


@dataclass
class PluginsConfig:
    """Dotted paths slime loads (``module.attr`` form, never ``module:attr``); ours are the hooks of
    :data:`aclarena_slime.slime_edge.HOOKS`, which the compiler holds each flag to."""

    custom_generate_function_path: str | None = hook_path("generate")
    custom_rm_path: str | None = hook_path("reward")
    rollout_function_path: str | None = None
    data_source_path: str | None = None
    custom_reward_post_process_path: str | None = None


@dataclass
class StageRecipe:
    name: str = MISSING
    kind: str = "rl"
    paths: PathsConfig = field(default_factory=PathsConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    lora: LoraSection = field(default_factory=LoraSection)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    plugins: PluginsConfig = field(default_factory=PluginsConfig)
    env_config: dict[str, Any] = field(default_factory=dict)  # aclarena_env_config: {tag: env settings}
    services: dict[str, ServiceConfig] = field(default_factory=dict)  # started by the launcher
    experts: dict[str, str] = field(default_factory=dict)  # env tag -> adapter, for aclarena_experts
    extra: dict[str, Any] = field(default_factory=dict)  # stage-specific flags (SDFT's SFT loss, OPD)
    custom: CustomConfig = field(default_factory=CustomConfig)  # typed aclarena_* sections of the custom config
    # The forgetting monitor over the earlier domains (the curriculum writes it). Both backends run it: the
    # local runner checks them itself; slime runs them as its --eval-config, the alarm in its eval-log hook.
    monitor: MonitorSettings = field(default_factory=MonitorSettings)
    parity: ParitySettings = field(default_factory=ParitySettings)  # slime LoRA stages: engine-vs-trainer gap
    notes: str = ""  # why this stage exists; printed by --dry-run

    @property
    def run_dir(self) -> str:
        return f"{self.paths.runs}/{self.name}"
