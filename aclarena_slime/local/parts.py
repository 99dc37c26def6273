"""The settings the stage's builder (:func:`aclarena_slime.local.session.open_session`) fills, free of torch: the
loss, the optimiser, the SFT steps, the sampling. Their modules (:mod:`.losses`, :mod:`.trainer`, :mod:`.sft`,
:mod:`.rollouts`) load torch; these do not, so ``--dry-run`` of a local stage builds its session without it. The
recipe's settings have no defaults here: the recipe's are the only ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aclarena_slime.kl import KL_TYPES

if TYPE_CHECKING:
    from aclarena_slime.local.group_filter import GroupFilter


ESTIMATORS = ("grpo", "gspo")  # slime's advantage estimators the local trainer runs


@dataclass(frozen=True)
class KlTerm:
    """The KL term to the reference policy (the stage's start): ``coef`` times slime's ``kind`` estimate
    (``algorithm.kl_loss_coef`` under ``use_kl_loss``, ``algorithm.kl_loss_type``); ``coef`` 0: none. A GRPO step's
    loss and the warm start's SFT hold the stage's one term."""

    coef: float
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in KL_TYPES:
            raise ValueError(f"kl_loss_type must be one of {', '.join(KL_TYPES)}, got {self.kind!r}")
        if self.coef < 0:
            raise ValueError(f"kl_loss_coef must be >= 0, got {self.coef!r}")


@dataclass(frozen=True)
class Backprop:
    """How an optimiser step's batch goes through the model: ``micro_batch_size`` sequences a forward and backward
    (the memory knob: their gradients add up to the batch's), then the gradient clipped to ``max_grad_norm``. A
    GRPO step and an SFT step run alike."""

    micro_batch_size: int
    max_grad_norm: float = 1.0  # slime's clip_grad default; no recipe key sets it

    def __post_init__(self) -> None:
        size = self.micro_batch_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"micro_batch_size must be a positive integer, got {self.micro_batch_size!r}")


@dataclass(frozen=True, kw_only=True)
class LossSettings:
    """The recipe's loss: ``algorithm.advantage_estimator``, ``algorithm.extra.calculate_per_token_loss``, the
    clip range (``eps_clip``, ``eps_clip_high``) and the KL term."""

    estimator: str
    per_token: bool
    clip_low: float
    clip_high: float
    kl: KlTerm

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"advantage_estimator must be one of {', '.join(ESTIMATORS)}, got {self.estimator!r}")


@dataclass(frozen=True)
class Sampling:
    """How a set of rollouts is drawn: ``samples`` a prompt at ``temperature`` / ``top_p``, ``max_new_tokens``
    each (None: the run's response budget, ``rollout.rollout_max_response_len``, as slime's rollout spends it;
    sample ``j`` of prompt ``i`` seeded from the stage's seed and its number, :mod:`.rollouts`)."""

    samples: int
    temperature: float
    top_p: float
    max_new_tokens: int | None

    def request(self, greedy: bool = False) -> dict[str, Any]:
        """The sampling parameters of its requests (greedy: temperature 0, no nucleus); a ``max_new_tokens``
        only where it is not the run's budget (:func:`aclarena_slime.rollout.loop_settings` spends that)."""
        params: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0} if greedy else {
            "temperature": self.temperature, "top_p": self.top_p}  # fmt: skip
        return params if self.max_new_tokens is None else {**params, "max_new_tokens": self.max_new_tokens}


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """The optimiser and the loss: AdamW (lr, betas, weight decay) on the recipe's loss (:class:`LossSettings`), and
    how a GRPO step's rollouts are cut into optimiser steps. No defaults: the stage's builder fills every value from
    the recipe (:func:`aclarena_slime.local.session.open_session`), whose defaults are the only ones.
    """

    loss: LossSettings
    lr: float
    adam_betas: tuple[float, float]
    weight_decay: float
    rollouts: Sampling  # how the rollouts it trains on were drawn: its log-probs are of the same distribution
    updates_per_step: int  # passes over a step's rollouts (PPO epochs; the local backend's own)
    minibatches: int  # optimiser steps per pass, each on a contiguous part (slime's num_steps_per_rollout)
    backprop: Backprop

    def __post_init__(self) -> None:
        if self.minibatches < 1:
            raise ValueError(f"minibatches must be >= 1, got {self.minibatches!r}")


class SftError(ValueError):
    """SFT data or settings that cannot work; the message says which."""


@dataclass(frozen=True)
class SftSettings:
    """``steps`` optimiser steps of ``batch_size`` examples each (seeded epochs over the examples), run as
    ``backprop`` says, with the stage's KL term (``kl``). The recipe's settings have no defaults here: the stage's
    builder (:func:`aclarena_slime.local.session.open_session`) fills them from ``cluster.local`` and the recipe."""

    steps: int
    batch_size: int
    lr: float
    backprop: Backprop
    kl: KlTerm
    weight_decay: float = 0.0
    # The report's NLL before and after SFT is measured on the first this many examples: enough to say whether SFT
    # fitted them; all of the search warm start's 2048 took 16 s of the main command, twice a forward over them.
    nll_examples: int = 512

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "nll_examples"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SftError(f"{name} must be a positive integer, got {value!r}")
        if self.lr <= 0:
            raise SftError(f"lr must be positive, got {self.lr!r}")


@dataclass(frozen=True)
class StepSampling:
    """A GRPO step's groups: ``prompts_per_step`` groups of ``groups``' rollouts, or with the recipe's dynamic
    sampling the first that many ``group_filter`` keeps, over at most ``max_rounds`` rounds of
    ``prompts_per_round`` prompts (:mod:`~aclarena_slime.local.group_filter`)."""

    groups: Sampling
    prompts_per_step: int
    prompts_per_round: int
    group_filter: GroupFilter | None
    max_rounds: int
