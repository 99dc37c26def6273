"""Which Megatron iterations a stage writes, so a later stage names one that exists.

slime saves with iteration = rollout id, 0-based, when ``(rollout_id + 1) % save_interval == 0`` and at the
last rollout (``slime.utils.misc.should_run_periodic_action``, called from ``train.py``): a stage with
``save_interval: 500`` writes ``iter_0000499`` (after its 500th rollout), ``iter_0000999``, ... . A stage
that loads ``checkpoint.ckpt_step`` of another must name one of those, or Megatron raises
``FileNotFoundError`` at actor init, after the engines started.
"""

from __future__ import annotations

from pathlib import Path

from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.recipes.schema import StageRecipe


def saves_iteration(iteration: int, save_interval: int, num_rollout: int | None = None) -> bool:
    """Whether slime's periodic save fires at rollout id ``iteration`` (its epoch-end save aside)."""
    return (num_rollout is not None and iteration == num_rollout - 1) or (iteration + 1) % save_interval == 0


def iteration_dir(load: str | Path, iteration: int) -> Path:
    """Megatron's folder for ``iteration`` under a checkpoint root (``get_checkpoint_name``)."""
    return Path(load) / f"iter_{iteration:07d}"


def check_ckpt_step(stage: StageRecipe, source: StageRecipe) -> None:
    """Refuse ``stage``'s ``checkpoint.ckpt_step`` unless ``source`` (the stage it loads) writes that iteration."""
    step = stage.checkpoint.ckpt_step
    if step is None:
        return
    interval = source.checkpoint.save_interval
    # An SFT stage's rollout count follows its data (--num-epoch): only the periodic saves are known now.
    last = source.rollout.num_rollout if source.kind != "sft" else None
    if not saves_iteration(step, interval, last):
        written = ", ".join(str(k * interval - 1) for k in range(1, 4))
        raise RecipeError(
            f"{stage.name}: checkpoint.ckpt_step={step} names {iteration_dir(source.checkpoint.save, step).name}, "
            f"which {source.name} never writes: slime saves iteration = rollout id (0-based) when (id + 1) % "
            f"save_interval == 0, so save_interval {interval} writes {written}, ... (ckpt_step={step - 1} is the "
            f"{step}th rollout)"
        )
