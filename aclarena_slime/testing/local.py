"""A local stage's session from a stage recipe with overrides, as the arena and ``launch/stage.sh`` build one: the
one way the local backend's tests (and its benchmarks) set up a stage.

:data:`LEARNABLE` is the small stage most of them run: the ``learnable`` env (registered by the test), a rank-8
LoRA expert, 4 GRPO steps of 4 prompts x 4 samples of at most 64 tokens, lr 1e-3, the per-sample mean, greedy
evaluation of 16 held-out prompts, no validation prompts, no warm start. A test of another env adds ``data.env=TAG``
(and ``+env_config.TAG={}`` for an env the recipe does not configure). A test of the trainer alone builds its
settings with :func:`trainer_settings`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aclarena_slime.launcher.stage import local_profile
from aclarena_slime.local.parts import Backprop, KlTerm, LossSettings, Sampling, TrainSettings
from aclarena_slime.local.session import LocalSession, open_session
from aclarena_slime.recipes.compose import load_recipe
from aclarena_slime.recipes.schema import StageRecipe

REPO = Path(__file__).resolve().parents[2]
MATH = REPO / "recipes" / "stage1_math.yaml"
LEARNABLE = (
    "data.env=learnable", "+env_config.learnable={}", "lora=r16_a32", "lora.rank=8", "lora.alpha=16",
    "rollout.num_rollout=4", "rollout.rollout_batch_size=4", "rollout.n_samples_per_prompt=4",
    "rollout.rollout_max_response_len=64", "algorithm.lr=1e-3", "algorithm.eps_clip_high=0.28",
    "++algorithm.extra.calculate_per_token_loss=false", "data.n_samples_per_eval_prompt=1", "data.eval_temperature=0.0",
    "++cluster.local.eval_size=16", "++cluster.local.max_concurrency=8", "++cluster.local.torch_threads=null",
    "++cluster.local.validation_eval=true", "++cluster.local.warm_start_steps=0", "++cluster.local.warm_start_lr=1e-3",
    "++cluster.local.warm_start_records=256", "++cluster.local.warm_start_demos=null",
    "++cluster.local.validation_size=0", "++cluster.local.validation_interval=0",
    "++cluster.local.warm_start_batch_size=16",
)  # fmt: skip


def local_recipe(root: str | Path, *overrides: str, recipe: str | Path = MATH) -> StageRecipe:
    """``recipe`` composed for the local backend (its profile, the env's local settings), outputs under ``root``
    (``<root>/runs/<name>/local``), ``overrides`` last."""
    items = [f"paths.root={root}", *overrides]
    return load_recipe(recipe, items, local_profile(items, always=True))


def local_session(root: str | Path, *overrides: str, recipe: str | Path = MATH) -> LocalSession:
    """:func:`local_recipe`'s session (:func:`~aclarena_slime.local.session.open_session`)."""
    return open_session(local_recipe(root, *overrides, recipe=recipe))


def trainer_settings(
    *, kl_coef: float = 0.0, per_token: bool = False, micro_batch_size: int = 8, temperature: float = 1.0, **over: Any
) -> TrainSettings:
    """A trainer's settings without a recipe, for tests of the trainer alone: AdamW at the schema's betas, lr 1e-3,
    slime's clip range (0.2, 0.28), the low-variance KL estimate, rollouts at ``temperature``, one pass of one
    optimiser step a GRPO step; ``over`` names any other field."""
    loss = LossSettings(estimator="grpo", per_token=per_token, clip_low=0.2, clip_high=0.28,
                        kl=KlTerm(kl_coef, "low_var_kl"))  # fmt: skip
    values: dict[str, Any] = {
        "lr": 1e-3, "adam_betas": (0.9, 0.999), "weight_decay": 0.0, "updates_per_step": 1, "minibatches": 1,
        "rollouts": Sampling(samples=4, temperature=temperature, top_p=1.0, max_new_tokens=None),
        "backprop": Backprop(micro_batch_size),
    }  # fmt: skip
    return TrainSettings(loss=loss, **{**values, **over})
