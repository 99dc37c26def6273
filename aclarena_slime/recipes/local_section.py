"""The recipe's ``cluster.local`` section: the local backend's own settings, declared and checked once.

Its own module, free of heavy imports: the recipe schema types ``cluster.local`` with it (a misspelt key or a
bad value fails when the recipe composes), the local stage's builder reads it with the recipe's other sections
(:func:`aclarena_slime.local.session.open_session`), and ``aclarena --help`` reads its defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

TINY_MODEL = "tiny"  # the local backend's tiny Qwen3-shaped model, built in process (no download)


WARM_START_TARGETS = ("backbone", "policy")


class LocalConfigError(ValueError):
    """A local-stage setting that cannot work; the message names the setting."""


@dataclass(frozen=True, kw_only=True)
class LocalBackendSettings:
    """``cluster.local``: the local backend's own settings, each declared and checked here once.

    Composing a recipe checks them (a key that is not a field fails naming it); the local stage's builder
    (:func:`aclarena_slime.local.session.open_session`) reads them with what the recipe's other sections give,
    and checks the combinations. The warm start is the paper's stage shape on the tiny model:
    ``warm_start_steps`` SFT steps on the env's gold demo trajectories (``warm_start_demos``, the env's
    dotted demo-turns function) before GRPO.
    """

    model: str = TINY_MODEL  # "tiny" or a Hugging Face model directory
    # The tiny model's size (model="tiny" only): BPE vocabulary, width, layers. With a warm start, its
    # tokenizer also learns from the warm-start records' prompts and gold turns (never the held-out ones).
    tiny_vocab_size: int = 512
    tiny_hidden_size: int = 64
    tiny_layers: int = 2
    backbone: str | None = None  # a merged / fine-tuned model folder replacing the base (chained stages)
    base_adapter: str | None = None  # a PEFT folder the expert continues (chained stages)
    seed: int = 0
    data_path: str | None = None  # None: the env's generated demo records
    eval_data_path: str | None = None  # None: eval_size further demo records (another seed)
    eval_size: int = 16
    # Evaluate the stage's own held-out prompts inside the stage (before the warm start, before and after GRPO;
    # with a sampled evaluation also greedily). False: not there (``eval_size`` still keeps them out of training),
    # as in the arena, whose evaluator measures every domain after every stage.
    stage_eval: bool = True
    # Validation prompts carved out of the RL records (never trained on, never the held-out ones): what the
    # profile's settings are chosen on, evaluated as the held-out prompts are every ``validation_interval`` GRPO
    # steps (0: before and after only); the held-out reward stays the reported figure.
    validation_size: int = 0
    validation_interval: int = 0
    # False: the validation prompts stay out of the RL records (the RL prompts are those of a run that evaluates
    # them) but are not evaluated; the main command's profile, whose user reads the held-out figure.
    validation_eval: bool = True
    # With the recipe's dynamic sampling (rollout.dynamic_sampling_filter_path), the most sampling rounds a GRPO step
    # rolls out before it trains on the groups it has kept (slime samples until its batch is full; a tiny model
    # whose groups all score alike would sample for ever).
    max_sampling_rounds: int = 4
    top_p: float = 1.0
    updates_per_step: int = 1  # optimiser passes over each step's rollouts (PPO epochs)
    engine_host: str = "127.0.0.1"
    engine_port: int = 0  # 0: a free port chosen by the OS
    max_concurrency: int = 8  # rollouts in flight at once against the engine
    max_running_requests: int = 64  # the engine's batch (EngineSettings)
    max_prefill_tokens: int = 4096
    micro_batch_size: int = 8  # sequences per forward/backward in the trainer
    torch_threads: int | None = None  # None: torch's default; 1 is fastest for the tiny model
    served_name: str = "local"  # OpenAI model name of the base; "<served_name>:<adapter>" for an adapter
    progress: bool = True
    warm_start_steps: int = 0  # 0: no warm start
    warm_start_demos: str | None = None
    warm_start_records: int = 256
    warm_start_lr: float = 1e-3
    warm_start_batch_size: int = 16
    warm_start_min_reward: float | None = None  # None: the env's best reward
    # What the warm start trains: "backbone" (a full fine-tune of the model; a LoRA expert then trains on the
    # new backbone) or "policy" (the stage's own policy: its LoRA expert on the unchanged model, as MLE needs
    # one frozen backbone under every expert; with full fine-tuning both are the same).
    warm_start_target: str = "backbone"

    def __post_init__(self) -> None:
        for name in ("max_concurrency", "updates_per_step", "micro_batch_size", "max_running_requests",
                     "max_prefill_tokens", "warm_start_records", "warm_start_batch_size", "max_sampling_rounds",
                     "tiny_vocab_size", "tiny_hidden_size", "tiny_layers"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LocalConfigError(f"{name} must be a positive integer, got {value!r}")
        steps = self.warm_start_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise LocalConfigError(f"warm_start_steps must be a non-negative integer, got {steps!r}")
        for name in ("eval_size", "validation_size", "validation_interval"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise LocalConfigError(f"{name} must be a non-negative integer, got {value!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise LocalConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise LocalConfigError(f"torch_threads must be a positive integer or None, got {self.torch_threads!r}")
        if not 0 <= self.engine_port < 65536:
            raise LocalConfigError(f"engine_port must be 0..65535, got {self.engine_port!r}")
        if self.warm_start_target not in WARM_START_TARGETS:
            raise LocalConfigError(
                f"warm_start_target must be one of {', '.join(WARM_START_TARGETS)}, got {self.warm_start_target!r}"
            )
        if self.warm_start_lr <= 0:
            raise LocalConfigError(f"warm_start_lr must be positive, got {self.warm_start_lr!r}")
        if self.tiny_hidden_size % 4:
            raise LocalConfigError(f"tiny_hidden_size must be a multiple of 4 (4 heads), got {self.tiny_hidden_size}")
