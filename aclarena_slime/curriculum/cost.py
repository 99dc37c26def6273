"""What a stage cost, for the comparison table: rollout tokens generated for training and trainer steps.

Local backend: counted from the stage's per-step figures (response tokens of the usable rollouts; one
trainer step per rollout batch). Slime: the recipe's planned steps (``num_rollout``); its token counts
live in slime's own logs, so ``rollout_tokens`` is None there.
"""

from __future__ import annotations

from typing import Any


def stage_cost(recipe: Any, metrics: dict[str, Any] | None) -> dict[str, Any]:
    steps = (metrics or {}).get("steps")
    if isinstance(steps, list):
        rollout = ((metrics or {}).get("config") or {}).get("rollout") or {}  # the recipe's section, as the stage ran
        per_step = int(rollout.get("rollout_batch_size", 0)) * int(rollout.get("n_samples_per_prompt", 0))
        tokens = sum(float(s.get("response_len_mean", 0.0)) * (per_step - float(s.get("excluded", 0.0))) for s in steps)
        return {"rollout_tokens": int(round(tokens)), "trainer_steps": len(steps), "counted": True}
    return {"rollout_tokens": None, "trainer_steps": int(recipe.rollout.num_rollout), "counted": False}
