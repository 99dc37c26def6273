"""The custom config's typed sections: the recipe's ``custom:`` schema and one reader per section.

Slime has no flags for our settings; ``--custom-config-path FILE.yaml`` sets each top-level key of the
file as an attribute of ``args``. :class:`CustomConfig` is the shape of the ``custom:`` section of a
recipe (the compiler writes it, non-empty sections only, into that file), so a misspelt key fails when
the recipe is composed, naming it. Each hook reads its section through one reader below, which checks
the keys again (``args`` may come from a hand-written file) and fills the defaults.

Sections written by the compiler from other parts of the recipe (``aclarena_env_config``,
``aclarena_experts``, ``aclarena_lora``) are not here: the recipe declares them elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from aclarena_slime.distill.balanced_source import ReplaySettings
from aclarena_slime.distill.mopd import MopdSettings
from aclarena_slime.group_rewards import FilterSettings, GuardSettings
from aclarena_slime.plugin.settings import from_mapping
from aclarena_slime.rollout import response_budget_mode
from aclarena_slime.sglang_client import RetryPolicy
from aclarena_slime.tis import TisSettings

if TYPE_CHECKING:
    from aclarena_slime.distill.sdft import MixtureSettings

T = TypeVar("T")


@dataclass
class SftFilterSettings:
    """Which teacher rollouts an SFT warm start keeps (the local backend's; the data recipes' on a cluster).

    Checked here, as the SFT data pipeline checks its own settings (:meth:`mixture`), so a bad status or token
    bound fails when the recipe composes, not when a stage reaches its SFT phase.
    """

    min_reward: float | None = None
    statuses: list[str] = field(default_factory=lambda: ["completed"])
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.min_reward is None:
            raise ValueError("aclarena_sft_filter needs min_reward")
        self.mixture()

    def mixture(self) -> MixtureSettings:
        """The filter as the SFT data pipeline's settings: the one conversion, for the local warm start and the
        curriculum's distill step (imported here, not at the top: the pipeline is not on a GRPO stage's route)."""
        from aclarena_slime.distill.sdft import MixtureError, MixtureSettings

        try:
            return MixtureSettings(
                default_threshold=self.min_reward,
                statuses=tuple(self.statuses),
                max_tokens=self.max_tokens,
            )
        except MixtureError as exc:
            raise ValueError(f"aclarena_sft_filter: {exc}") from exc


@dataclass
class CustomConfig:
    """A recipe's ``custom:`` section; each field becomes one attribute of slime's ``args``."""

    # What the response budget bounds: "total" (None; all turns together) or "per_turn" (each model turn).
    aclarena_response_budget: str | None = None
    aclarena_filters: FilterSettings | None = None  # the group filters (group_rewards)
    aclarena_tis: TisSettings | None = None  # the mismatch correction (tis)
    aclarena_mopd: MopdSettings | None = None  # the MOPD teachers (distill.mopd)
    aclarena_replay: ReplaySettings | None = None  # replay of earlier domains (set by the curriculum)
    aclarena_balance_key: str | None = None  # the metadata key the balanced data source splits on
    aclarena_sft_filter: SftFilterSettings | None = None  # an SFT warm start's teacher-rollout filter
    # When a run stops for what its rollouts produce (rollout_guard); None: the defaults, which always apply.
    aclarena_guards: GuardSettings | None = None
    # How long a rollout request waits for its engine (tries, the wait between them, the read timeout); None:
    # slime's own patience (sglang_client.RetryPolicy).
    aclarena_engine: RetryPolicy | None = None

    def __post_init__(self) -> None:
        response_budget_mode(self.aclarena_response_budget)  # a misspelt budget fails when the recipe composes

    def to_custom_config(self) -> dict[str, Any]:
        """The sections that are set, as plain YAML-ready values."""
        return {
            f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if getattr(self, f.name) is not None
        }


def _plain(value: Any) -> Any:
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _section(args: Any, name: str, cls: type[T]) -> T | None:
    value = getattr(args, name, None)
    if value is None or isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a mapping of settings, got {type(value).__name__}")
    return from_mapping(cls, value, f"{name} keys")


def response_budget(args: Any) -> str:
    """``aclarena_response_budget``: ``total`` unless set."""
    return response_budget_mode(getattr(args, "aclarena_response_budget", None))


def filters(args: Any) -> FilterSettings:
    return _section(args, "aclarena_filters", FilterSettings) or FilterSettings()


def guards(args: Any) -> GuardSettings:
    return _section(args, "aclarena_guards", GuardSettings) or GuardSettings()


def tis(args: Any) -> TisSettings:
    return _section(args, "aclarena_tis", TisSettings) or TisSettings()


def mopd(args: Any) -> MopdSettings:
    return _section(args, "aclarena_mopd", MopdSettings) or MopdSettings()


def replay(args: Any) -> ReplaySettings | None:
    return _section(args, "aclarena_replay", ReplaySettings)


def engine(args: Any) -> RetryPolicy:
    return _section(args, "aclarena_engine", RetryPolicy) or RetryPolicy()


def balance_key(args: Any) -> str | None:
    return getattr(args, "aclarena_balance_key", None)
