"""The arena's methods: each turns the arena's stages into one curriculum (what every stage trains, from what).

A method is a function ``method(stages, options) -> dict``: ``stages`` the arena's :class:`ArenaStage` list
in training order, ``options`` the mapping under the method's name in the arena file (minus ``method``). It
returns the curriculum's own keys (``stages`` and any section: ``replay``, ``kl_anchor``, ``monitor``), plus
``independent: true`` when its stages are separate models (the oracles: each evaluated on its own, the
comparison reads the diagonal). The arena file names each method by dotted path, so a method of your own is
a function in your package and one line in the arena file (``docs/arena.md``); nothing here lists them.

Every stage starts from the arena's shared base model (the arena sets ``checkpoint.load``); a stage that
starts ``previous`` continues the stage before (the runner's lineage wins over the base).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from aclarena_slime.dotted import DottedPathError, load_dotted

FULL_FT = "lora.enabled=false"  # the paper's chain and oracles are full fine-tuning
LORA = "lora.enabled=true"
WARM_START_INTO_EXPERT = "++cluster.local.warm_start_target=policy"  # a local stage's warm start trains the LoRA


@dataclass
class ArenaStage:
    """One stage of the arena: the domain it trains, its stage recipe, and its own overrides (sizing)."""

    name: str = MISSING  # the env tag its recipe trains: the stage's name in every manifest, the matrix column
    recipe: str = MISSING  # relative to the arena file's folder, or absolute
    overrides: list[str] = field(default_factory=list)
    eval_size: int | None = None  # held-out prompts of this domain (None: the arena's eval_size)


Method = Callable[[Sequence[ArenaStage], Mapping[str, Any]], dict[str, Any]]


class MethodError(ValueError):
    """A method that cannot be loaded or returned no curriculum; the message names it."""


def load_method(path: str) -> Method:
    """The function at ``package.module.function`` (or ``package.module:function``)."""
    try:
        fn = load_dotted(path)
    except DottedPathError as exc:
        raise MethodError(f"a method: {exc}") from exc
    except (ImportError, AttributeError) as exc:
        raise MethodError(f"cannot load the method {path!r}: {exc}") from exc
    if not callable(fn):
        raise MethodError(f"method {path!r} is not a function")
    return fn


def entry(stage: ArenaStage, *overrides: str, start: str = "previous", expert: str | None = None) -> dict[str, Any]:
    """A curriculum stage entry for ``stage``: the arena stage's overrides, then the method's."""
    out: dict[str, Any] = {"name": stage.name, "recipe": stage.recipe, "start": start,
                           "overrides": [*stage.overrides, *overrides]}  # fmt: skip
    if expert:
        out["expert"] = expert
    return out


def sequential(stages: Sequence[ArenaStage], options: Mapping[str, Any]) -> dict[str, Any]:
    """The paper's baseline: full fine-tuning, each stage from the policy the one before left."""
    return {"stages": [entry(s, FULL_FT) for s in stages]}


def replay(stages: Sequence[ArenaStage], options: Mapping[str, Any]) -> dict[str, Any]:
    """The sequential chain, every batch of stage k also replaying stages 1..k-1's prompts (the curriculum's
    ``replay`` section; ``options`` are :class:`~aclarena_slime.distill.balanced_source.ReplaySettings`)."""
    return {**sequential(stages, options), "replay": {"enabled": True, **options}}


def kl_anchor(stages: Sequence[ArenaStage], options: Mapping[str, Any]) -> dict[str, Any]:
    """The sequential chain with a KL term to the policy the previous stage left, from stage 2 on.

    Written as a method (per-stage overrides) to show the shape of one: on the local backend a stage's KL
    reference is the policy it starts from, so the overrides alone make the anchor. ``options``: ``coef``
    (default 0.1), ``loss_type`` (default ``low_var_kl``). The paper curricula use the ``kl_anchor``
    section, which also points slime's ``--ref-load`` at the previous checkpoint.
    """
    coef, loss_type = float(options.get("coef", 0.1)), str(options.get("loss_type", "low_var_kl"))
    unknown = sorted(set(options) - {"coef", "loss_type"})
    if unknown or coef <= 0:
        raise MethodError(f"kl_anchor: options are coef (> 0) and loss_type; got {dict(options)}")
    kl = ("++algorithm.use_kl_loss=true", f"++algorithm.kl_loss_coef={coef}", f"++algorithm.kl_loss_type={loss_type}")
    return {"stages": [entry(s, FULL_FT, *(kl if i else ())) for i, s in enumerate(stages)]}


def mle(stages: Sequence[ArenaStage], options: Mapping[str, Any]) -> dict[str, Any]:
    """Mixture of LoRA experts: one expert per stage on the frozen base, routed by the stage's env tag (its name).

    The stage's warm start trains its expert too (``warm_start_target=policy``), so the base stays the one
    backbone every expert is served on. ``options``: the expert's learning rates, ``lr`` (GRPO) and
    ``warm_start_lr`` (a LoRA trains a small update of the weights and wants a larger step than full
    fine-tuning); absent: the stage's own.
    """
    unknown = sorted(set(options) - {"lr", "warm_start_lr"})
    if unknown or any(float(v) <= 0 for v in options.values()):
        raise MethodError(f"mle: options are lr and warm_start_lr (> 0); got {dict(options)}")
    rates = [f"algorithm.lr={options['lr']}"] if "lr" in options else []
    rates += [f"++cluster.local.warm_start_lr={options['warm_start_lr']}"] if "warm_start_lr" in options else []
    return {"stages": [entry(s, LORA, WARM_START_INTO_EXPERT, *rates, start="recipe", expert=s.name) for s in stages]}


def oracles(stages: Sequence[ArenaStage], options: Mapping[str, Any]) -> dict[str, Any]:
    """Each domain trained alone from the base, full fine-tuning: the per-task ceilings."""
    return {"stages": [entry(s, FULL_FT, start="recipe") for s in stages], "independent": True}
