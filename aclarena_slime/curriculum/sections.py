"""The recipe sections a curriculum writes into a stage: lineage, KL anchor, replay, monitor.

The curriculum describes what a stage is in its recipe and nothing else; each backend reads the sections
and runs them (or refuses them, naming the setting). Nothing here imports a backend.

- lineage: the stage starts from its source's checkpoint (slime) or adapter (``cluster.local.base_adapter``).
- KL anchor: ``algorithm.use_kl_loss`` with the previous stage as the reference (``checkpoint.ref_load``
  on slime; the local backend's reference is the policy the stage starts from, its ``base_adapter``).
- replay: ``custom.aclarena_replay`` and the balanced data source; the earlier stages' env settings (each
  env's as its own stage ran it) and services join the stage's, so the multi-env rollout can run every
  replayed prompt. The local backend mixes the earlier envs' records into its own with the same balancer
  and weights, in its GRPO batches and in its warm start (the earlier stages' gold demos, as each warm-started).
- monitor: the recipe's ``monitor`` section, the earlier domains checked while the stage trains. The local
  backend runs the check itself; slime runs the datasets as its ``--eval-config`` and the alarm in its
  eval-log hook (:mod:`aclarena_slime.slime_edge.monitor`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

from aclarena_slime.curriculum.config import KlAnchorSettings
from aclarena_slime.distill.balanced_source import ReplaySettings
from aclarena_slime.evaluation.monitor import MonitorSettings
from aclarena_slime.slime_edge import path as hook_path

DATA_SOURCE = hook_path("balanced_data_source")


def lineage_overrides(source: dict[str, Any] | None) -> list[str]:
    """Hydra overrides that start a stage from ``source``'s output (a checkpoint, else an adapter)."""
    if source is None:
        return []
    if source.get("checkpoint"):
        out = [f"checkpoint.load={source['checkpoint']}"]  # ref_load follows load unless a recipe says otherwise
        if source.get("hf_checkpoint"):  # SGLang serves the weights Megatron loads (LoRA syncs only the adapter)
            out.append(f"model.hf_checkpoint={source['hf_checkpoint']}")
        return out
    if source.get("adapter"):
        return [f"++cluster.local.base_adapter={source['adapter']}"]
    raise ValueError(f"stage {source['name']} left neither a checkpoint nor an adapter to start from")


def anchor_overrides(settings: KlAnchorSettings, source: dict[str, Any] | None) -> list[str]:
    """The KL-anchor baseline's overrides: the KL loss on, its reference the source stage's checkpoint."""
    if not settings.enabled:
        return []
    out = ["++algorithm.use_kl_loss=true", f"++algorithm.kl_loss_coef={settings.coef}",
           f"++algorithm.kl_loss_type={settings.loss_type}"]  # fmt: skip
    if source is not None and source.get("checkpoint"):  # explicit: a recipe pinning ref_load to the base loses
        out.append(f"++checkpoint.ref_load={source['checkpoint']}")
    return out


def attach_replay(recipe: Any, settings: ReplaySettings, earlier: Sequence[Any]) -> Any:
    """Make ``recipe`` (stage k) replay the domains of the ``earlier`` stage recipes; returns it."""
    own = recipe.data.env
    # the latest stage of each earlier domain the section replays
    previous = {r.data.env: r for r in earlier if r.data.env != own and r.data.env not in settings.exclude}
    if not settings.enabled or not previous:
        return recipe
    if recipe.plugins.data_source_path not in (None, DATA_SOURCE):
        raise ValueError(f"replay: stage {recipe.name} already has a data source ({recipe.plugins.data_source_path})")
    recipe.plugins.data_source_path = DATA_SOURCE
    recipe.custom.aclarena_replay = dataclasses.replace(
        settings,
        current=own,
        data={tag: r.data.prompt_data for tag, r in previous.items()},
        warm_start={tag: warm_start_demos(r) for tag, r in previous.items() if r.cluster.local.warm_start_demos},
    )
    adopt_envs(recipe, list(previous.values()))  # the multi-env rollout needs every replayed env
    return recipe


def warm_start_demos(recipe: Any) -> dict[str, Any]:
    """How ``recipe``'s stage warm-starts on its gold demos (local backend), for a later stage to replay them."""
    local = recipe.cluster.local
    return {"demos": local.warm_start_demos, "max_response_len": recipe.rollout.rollout_max_response_len,
            "min_reward": local.warm_start_min_reward}  # fmt: skip


def adopt_envs(recipe: Any, earlier: Sequence[Any]) -> None:
    """Give ``recipe`` the env settings and services of the ``earlier`` stages' envs (its own services win).

    An earlier env runs with the settings its own stage (the latest of its domain) ran with, as that stage's
    backend composed them (on the local backend its local env settings, the engine placeholders bound when
    this stage's engine starts), not with whatever ``recipe`` holds for it: a setting every stage gets for an
    env (the arena's ``++env_config.<tag>.data_dir``) would be a partial entry, the paper's settings for the
    rest. The stage's own env keeps its settings.
    """
    for r in earlier:
        tag, settings = r.data.env, r.env_config.get(r.data.env)
        if tag != recipe.data.env and (settings is not None or tag not in recipe.env_config):
            recipe.env_config[tag] = copy.deepcopy(settings or {})
        for name, service in r.services.items():
            recipe.services.setdefault(name, service)


def attach_monitor(recipe: Any, settings: MonitorSettings, domains: list[str], earlier: Sequence[Any] = ()) -> Any:
    """Give a stage recipe its ``monitor`` section over ``domains`` (the earlier env tags); returns the recipe.

    Each backend runs the section (the local runner checks the domains itself; the slime compiler writes
    them into ``--eval-config`` with the alarm's hook). The ``earlier`` stage recipes lend their env settings
    and services, so the stage can run their envs.
    """
    domains = [d for d in dict.fromkeys(domains) if d and d != recipe.data.env]
    if not settings.enabled or not domains:
        return recipe
    recipe.monitor = dataclasses.replace(settings, domains=domains)
    adopt_envs(recipe, [r for r in earlier if r.data.env in domains])
    return recipe
