"""A stage recipe run on the local backend: its session (:func:`~aclarena_slime.local.session.open_session`), or
with ``lora.experts`` each expert's (parallel MLE), and what ``--dry-run`` prints of it (:func:`local_plan`)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aclarena_slime.experts import EXPERTS_NAME
from aclarena_slime.local.session import LocalSession, open_session

if TYPE_CHECKING:
    from aclarena_slime.recipes.schema import StageRecipe


def local_plan(session: LocalSession) -> str:
    """What ``--dry-run`` prints for a local stage (:func:`~aclarena_slime.local.session.open_session`'s parts):
    its phases and every resolved setting."""
    loop, policy, warm, sft = session.loop, session.policy, session.warm_start, session.sft
    sampling, loss = loop.sampling, policy.train.loss
    phases = []
    if warm is not None:
        phases.append(f"warm start ({warm.sft.steps} SFT steps on {warm.demos} gold demos)")
    if session.kind == "sft":
        text = f"{sft.epochs} epoch(s) on teacher rollouts kept by {sft.filter}"
        if sft.steps_per_epoch > 1:
            text += f", {sft.steps_per_epoch} optimiser steps an epoch"
        phases.append(f"SFT ({text})")
    else:
        grpo = f"{loop.steps} steps x {sampling.prompts_per_step} prompts x {sampling.groups.samples} samples"
        if loop.dynamic_sampling:
            kept = sampling.group_filter.path if sampling.group_filter else "no filter"
            grpo += (f"; groups kept by {kept}, sampled {sampling.prompts_per_round} prompts a "
                     f"round, at most {sampling.max_rounds} rounds a step")  # fmt: skip
        minibatches = policy.train.minibatches
        if minibatches > 1:
            per_update = sampling.prompts_per_step * sampling.groups.samples // minibatches
            grpo += f"; {minibatches} optimiser steps of {per_update} samples a step"
        phases.append(f"GRPO ({grpo})")
    kind = "full fine-tuning (every parameter)" if policy.full else f"LoRA expert {policy.name!r}"
    kl = f"KL {loss.kl.kind} x {loss.kl.coef} to the starting policy" if loss.kl.coef else "no KL term"
    lines = [
        f"# local plan: env {session.env}, model {session.model.source}, seed {session.seed}",
        f"# phases: {' -> '.join(phases)}",
        f"# policy: {kind}; AdamW lr {policy.train.lr}; {kl}",
        f"# loss: {loss.estimator}, " + ("the token mean" if loss.per_token else "the per-sample mean")
        + " (aclarena_slime.local.losses)",
        f"# outputs: {session.paths.output_dir}",
    ]
    return "\n".join(lines + ["#   " + line for line in json.dumps(session.settings, indent=2, default=str).splitlines()])


def _local_env(tag: str) -> dict[str, Any]:
    """The env's own local-backend settings (``recipes/env/local/<tag>.yaml``'s ``env_config.<tag>``): the
    local profile composes them for the data's env only, and a parallel-MLE expert of another env needs them.
    A variant tag (``PLUGIN-VARIANT``) without a file of its own has its plugin's."""
    import yaml

    from aclarena_slime.plugin.registry import UnknownEnvironment, plugin_tag
    from aclarena_slime.recipes.compiler import REPO_ROOT

    folder = REPO_ROOT / "recipes" / "env" / "local"
    own = tag
    if not (folder / f"{tag}.yaml").is_file():
        try:
            own = plugin_tag(tag)
        except UnknownEnvironment:
            return {}
    path = folder / f"{own}.yaml"
    values = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else None
    return dict(((values or {}).get("env_config") or {}).get(own) or {})


def expert_sessions(session: LocalSession, env_configs: Mapping[str, Any]) -> list[LocalSession]:
    """Parallel MLE (``lora.experts``): one expert's session per env tag, the stage's (its
    :func:`~aclarena_slime.local.session.open_session`) otherwise equal: the tag's env and env settings (the recipe's
    ``env_configs``, under the tag's local ones), a LoRA adapter of the tag's name, outputs under ``experts/<tag>``.
    A stage without a LoRA expert (full fine-tuning) has none.

    The experts share the frozen backbone, so none of them warm-starts it (a warning says so when the env's
    local profile asks for a warm start)."""
    policy, records = session.policy, session.records
    lora = policy.lora
    if lora is None:
        return []
    if session.warm_start is not None:
        warnings.warn(
            "lora.experts: parallel MLE trains on the frozen backbone; it runs without the warm start", stacklevel=2
        )
    out = []
    for tag in lora.experts or []:
        env_config = records.env_config if tag == session.env else {**(env_configs.get(tag) or {}),
                                                                    **_local_env(tag)}  # fmt: skip
        expert = dataclasses.replace(lora, adapter_name=tag, experts=None)
        output_dir = session.paths.output_dir / "experts" / tag
        settings = {"env": tag, "env_config": dict(env_config), "lora": expert.to_dict(), "output_dir": str(output_dir),
                    "local": {**session.settings["local"], "warm_start_steps": 0}}  # fmt: skip
        out.append(dataclasses.replace(
            session,
            paths=dataclasses.replace(session.paths, output_dir=output_dir),
            records=dataclasses.replace(records, env=tag, env_config=env_config, warm_start_records=0),
            policy=dataclasses.replace(policy, name=tag, lora=expert),
            warm_start=None,
            settings={**session.settings, **settings},
        ))  # fmt: skip
    return out


def run_local(recipe: StageRecipe) -> dict[str, Any]:
    """Run the stage on the local backend; returns its metrics and where the policy is (with ``lora.experts``,
    the experts' manifest)."""
    from aclarena_slime.local.stage import run_stage

    session = open_session(recipe)
    paths, policy = session.paths, session.policy
    if policy.lora is not None and policy.lora.experts:
        from aclarena_slime.local.parallel_mle import open_experts, run_parallel_mle

        metrics = run_parallel_mle(open_experts(expert_sessions(session, recipe.env_config)), str(paths.output_dir))
        manifest = str(paths.output_dir / EXPERTS_NAME)
        return {"metrics": metrics, "policy": manifest, "full": False, "output_dir": str(paths.output_dir)}
    metrics = run_stage(session)
    return {"metrics": metrics, "policy": str(paths.policy_dir), "full": policy.full, "output_dir": str(paths.output_dir)}
