"""LoRA settings: the one type for a recipe's ``lora:`` section, the Megatron actor and the local backend.

The recipe schema's ``LoraSection`` is this class plus ``enabled``; the compiler hands its fields to the
actor, and the local backend trains its expert with it (Megatron target names, mapped to Hugging Face
projections through ``HF_TARGETS``). A recipe reaches the actor through ``--custom-config-path FILE.yaml``,
which sets attributes on ``args``: either one dict ``aclarena_lora: {rank: 16, alpha: 32, ...}`` or flat
attributes ``aclarena_lora_rank``, ``aclarena_lora_alpha``, ... (the flat ones win when both are given).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from aclarena_slime.experts import ExpertError, validate_adapter_name
from aclarena_slime.plugin.settings import from_mapping

# Megatron module name -> the Hugging Face projections it becomes (fused layers split on export).
HF_TARGETS: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}
# Modules only the local backend (PEFT on a Hugging Face model) adapts: the HF projections one by one, and
# the output head (a tiny random model learns through it; see tests/local/test_stage.py).
HF_ONLY_TARGETS = tuple(dict.fromkeys(hf for names in HF_TARGETS.values() for hf in names)) + ("lm_head",)
# Regex for slime's --only-train-params-name-list: matches adapter weights and nothing else.
ADAPTER_PARAM_PATTERN = r"\.lora_[AB]\.weight$"
SYNC_MODES = ("tensors", "disk")
# /pause_generation modes that fit an adapter swap (SGLang 0.5.15 io_struct.PauseGenerationReqInput).
PAUSE_MODES = ("abort", "retract")
PAYLOAD_SCHEMAS = ("auto", "serialized_tensors", "serialized_named_tensors")


class LoraConfigError(ValueError):
    """A LoRA setting that cannot work; the message names the setting."""


@dataclass
class LoraConfig:
    """What the adapters look like and how they reach SGLang; validated when built (treat it as read-only:
    it is a plain dataclass so that a recipe's structured config can merge into it).

    Defaults are the paper's MLE setting (rank 16, alpha 32 on the four GPT linears; from the
    authors' released scripts, WillDreamer/ACLArena).
    """

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    # Megatron module names (HF_TARGETS keys); the PEFT / SGLang names follow from them.
    target_modules: list[str] = field(default_factory=lambda: list(HF_TARGETS))
    # Seeds the A matrices; the same seed gives the same adapter under any TP size.
    init_seed: int = 1234
    # Name the adapter is served under by SGLang (the expert's env tag, e.g. "math"); in a recipe, None
    # means the data's env tag.
    adapter_name: str | None = "expert"
    # "disk": after every step the PEFT directory <sync_dir>/<adapter_name> is written and SGLang loads it
    # (/load_lora_adapter); sync_dir must be readable by every SGLang server (a shared filesystem on
    # several nodes). The recipe compiler sets it to <checkpoint.save>/adapters.
    # "tensors": /load_lora_adapter_from_tensors with torch's ForkingPickler encoding; needs trainer and
    # server on one host (CPU storage crosses processes only through the sender's resource sharer, so a
    # separate SGLang process fails; CUDA tensors would need CUDA IPC). Unverified against a real server.
    sync_mode: str = "disk"
    sync_dir: str | None = None
    sglang_payload: str = "auto"
    # How each server pauses around the swap; sent explicitly (SGLang reads an empty body as "abort").
    # "abort": in-flight requests end with finish reason abort; slime's synchronous train.py has none
    # in flight at a sync. "retract": in-flight requests go back to the waiting queue and resume after
    # the swap (asynchronous rollout), but only requests on *other* adapters: SGLang's unload waits
    # until no request holds the adapter (lora_registry.wait_for_unload), and a retracted request still
    # holds it, so a paused server would never finish the unload (checked in SGLang 0.5.15.post1).
    pause_mode: str = "abort"
    # Parallel MLE: the env tags whose experts one job trains side by side on the frozen backbone, in
    # adapter-index order (each adapted layer stacks them; each sample selects its own). Each expert is
    # served, synced and exported under its tag. None: one adapter, ``adapter_name``.
    experts: list[str] | None = None
    # None: one adapter name, replaced at each sync (slime's train.py). An integer: every sync loads a new
    # version, <adapter_name>@<N>, beside the last ones; an episode keeps the version it started on for all
    # its turns, and versions more than staleness_budget syncs old are unloaded once no request holds them
    # (so staleness_budget + 1 versions stay resident). Needs sync_dir: the ledger of versions lives there.
    staleness_budget: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, str):
            self.target_modules = self.target_modules.split(",")
        self.target_modules = list(self.target_modules)
        if not isinstance(self.rank, int) or self.rank < 1:
            raise LoraConfigError(f"lora rank must be a positive integer, got {self.rank!r}")
        if self.alpha <= 0:
            raise LoraConfigError(f"lora alpha must be positive, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise LoraConfigError(f"lora dropout must be in [0, 1), got {self.dropout!r}")
        unknown = sorted(set(self.target_modules) - set(HF_TARGETS) - set(HF_ONLY_TARGETS))
        if unknown or not self.target_modules:
            raise LoraConfigError(
                f"lora target_modules must be a non-empty subset of {sorted(HF_TARGETS)} (or, on the local "
                f"backend, of {list(HF_ONLY_TARGETS)}), got unknown {unknown}"
            )
        if self.sync_mode not in SYNC_MODES:
            raise LoraConfigError(f"lora sync_mode must be one of {SYNC_MODES}, got {self.sync_mode!r}")
        try:
            if self.adapter_name is not None:  # SGLang's name for it, and its folder under sync_dir
                validate_adapter_name(self.adapter_name)
        except ExpertError as exc:
            raise LoraConfigError(f"lora adapter_name: {exc}") from exc
        if self.experts is not None:
            self.experts = list(self.experts)
            if not self.experts or len(set(self.experts)) != len(self.experts):
                raise LoraConfigError(f"lora experts must be distinct env tags, at least one, got {self.experts!r}")
            for tag in self.experts:
                try:
                    validate_adapter_name(tag)
                except ExpertError as exc:
                    raise LoraConfigError(f"lora experts: {exc}") from exc
        if self.pause_mode not in PAUSE_MODES:
            raise LoraConfigError(f"lora pause_mode must be one of {PAUSE_MODES}, got {self.pause_mode!r}")
        if self.staleness_budget is not None and (
            not isinstance(self.staleness_budget, int) or self.staleness_budget < 0
        ):
            raise LoraConfigError(
                f"lora staleness_budget must be None or an integer >= 0, got {self.staleness_budget!r}"
            )
        if self.sglang_payload not in PAYLOAD_SCHEMAS:
            raise LoraConfigError(f"lora sglang_payload must be one of {PAYLOAD_SCHEMAS}, got {self.sglang_payload!r}")

    @property
    def num_adapters(self) -> int:
        """How many adapters each adapted layer stacks (1 unless parallel MLE)."""
        return len(self.experts) if self.experts else 1

    @property
    def adapter_names(self) -> list[str]:
        """The served names, in adapter-index order."""
        if self.experts:
            return list(self.experts)
        if self.adapter_name is None:
            raise LoraConfigError("lora adapter_name is not set")
        return [self.adapter_name]

    def adapter_index(self, tag: str) -> int:
        """The adapter a sample of env ``tag`` trains (parallel MLE); an unknown tag is an error."""
        if not self.experts:
            return 0
        if tag not in self.experts:
            raise LoraConfigError(f"no parallel-MLE expert for env tag {tag!r}; experts: {self.experts}")
        return self.experts.index(tag)

    def require_megatron_targets(self) -> None:
        """The Megatron actor adapts its fused linears only: refuse a Hugging Face module name."""
        hf_only = [name for name in self.target_modules if name not in HF_TARGETS]
        if hf_only:
            raise LoraConfigError(
                f"lora target_modules {hf_only} are Hugging Face module names, which only the local backend adapts; "
                f"the Megatron actor takes {sorted(HF_TARGETS)}"
            )

    def require_sync_dir(self) -> None:
        """Disk sync writes under ``sync_dir``: refuse to start a run that would fail at its first sync."""
        if self.sync_mode == "disk" and not self.sync_dir:
            raise LoraConfigError("lora sync_mode 'disk' needs sync_dir (a folder every SGLang server can read)")
        if self.staleness_budget is not None and not self.sync_dir:
            raise LoraConfigError("lora staleness_budget needs sync_dir (the ledger of adapter versions lives there)")

    @property
    def scaling(self) -> float:
        """The factor on B·A, as PEFT computes it (alpha / rank, not rsLoRA)."""
        return self.alpha / self.rank

    def hf_target_modules(self) -> list[str]:
        """The PEFT / SGLang module names these targets become (Megatron names split, HF names kept)."""
        return list(dict.fromkeys(hf for name in self.target_modules for hf in HF_TARGETS.get(name, (name,))))

    def to_dict(self) -> dict[str, Any]:
        """The fields of this class only (a recipe's ``LoraSection`` adds ``enabled``, which is not a setting
        of the adapter)."""
        return {f.name: getattr(self, f.name) for f in fields(LoraConfig)}

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> LoraConfig:
        """Build from a plain dict; unknown keys are an error, so a typo never goes unnoticed."""
        return from_mapping(cls, dict(values), "lora settings", LoraConfigError)

    @classmethod
    def from_args(cls, args: Any) -> LoraConfig:
        """Read ``args.aclarena_lora`` (dict) and ``args.aclarena_lora_<field>`` attributes."""
        values: dict[str, Any] = dict(getattr(args, "aclarena_lora", None) or {})
        for f in fields(cls):
            flat = getattr(args, f"aclarena_lora_{f.name}", None)
            if flat is not None:
                values[f.name] = flat
        config = cls.from_mapping(values)
        config.require_megatron_targets()
        return config
