"""The replay baseline: stage k trains on its own prompts plus a share of the earlier stages' prompts.

A data mixture, not new machinery. On slime, the stage's data source becomes the balanced source
(the ``balanced_data_source`` hook of :mod:`aclarena_slime.slime_edge`) with ``aclarena_replay`` in the
custom config, and the earlier stages' env settings and services join the stage's, so the multi-env
rollout can run every replayed prompt. On the local backend, :func:`local_replay_records` mixes the
earlier envs' records into the stage's training records with the same balancer and weights.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from aclarena_slime.distill.balanced_source import DomainBalancer, ReplaySettings, replay_weights
from aclarena_slime.slime_edge import path as hook_path

DATA_SOURCE = hook_path("balanced_data_source")


def attach_replay(recipe: Any, settings: ReplaySettings, earlier: Sequence[Any], local: bool) -> Any:
    """Make ``recipe`` (stage k) replay the domains of the ``earlier`` stage recipes; returns it."""
    own = recipe.data.env
    previous = {r.data.env: r for r in earlier if r.data.env != own}  # the latest stage of each domain
    if not settings.enabled or not previous:
        return recipe
    if local:
        from aclarena_slime.launcher.local_stage import local_settings

        recipe.cluster.local["replay"] = {
            **settings.to_dict(),
            "current": own,
            "domains": list(previous),
            "env_config": {tag: local_settings(r)["env_config"] for tag, r in previous.items()},
        }
        return recipe
    if recipe.plugins.data_source_path not in (None, DATA_SOURCE):
        raise ValueError(f"replay: stage {recipe.name} already has a data source ({recipe.plugins.data_source_path})")
    recipe.plugins.data_source_path = DATA_SOURCE
    recipe.custom.aclarena_replay = dataclasses.replace(
        settings, current=own, data={tag: r.data.prompt_data for tag, r in previous.items()}
    )
    adopt_envs(recipe, list(previous.values()))  # the multi-env rollout needs every replayed env
    return recipe


def adopt_envs(recipe: Any, earlier: Sequence[Any]) -> None:
    """Give ``recipe`` the env settings and services of the ``earlier`` stages' envs (its own win)."""
    for r in earlier:
        recipe.env_config.setdefault(r.data.env, copy.deepcopy(r.env_config.get(r.data.env) or {}))
        for name, service in r.services.items():
            recipe.services.setdefault(name, service)


def local_replay(cfg: Any, train: list[dict[str, Any]], args: Any, url: str) -> list[dict[str, Any]]:
    """The local stage's training records with the earlier domains mixed in (``cfg.replay``; empty: ``train``).

    Every earlier env is served too: its settings go into ``args.aclarena_env_config`` and its requests
    to the adapter being trained. Each step's prompts hold the replay shares (largest remainder).
    """
    values = dict(cfg.replay or {})
    if not values.get("enabled") or not values.get("domains"):
        return train
    from aclarena_slime.local.records import demo_records
    from aclarena_slime.local.stage import bind_engine
    from aclarena_slime.plugin.registry import get_environment

    earlier = {}
    for tag in values["domains"]:
        config = bind_engine((values.get("env_config") or {}).get(tag) or {}, url, cfg.served_name)
        earlier[tag] = demo_records(get_environment(tag, config), len(train), cfg.seed)
        args.aclarena_env_config[tag] = config
        args.aclarena_experts[tag] = cfg.expert_name
    return replay_records(values, train, earlier, cfg.seed, cfg.prompts_per_step)


def replay_records(
    values: Mapping[str, Any],
    own: list[dict[str, Any]],
    earlier: Mapping[str, list[dict[str, Any]]],
    seed: int,
    per_step: int,
) -> list[dict[str, Any]]:
    """``len(own)`` training records, each ``per_step`` of them holding the replay shares."""
    settings = ReplaySettings(**{k: v for k, v in values.items() if k not in ("domains", "env_config")})
    current = settings.current or ""
    pool = list(own) + [r for tag in earlier for r in earlier[tag]]
    buckets: dict[str, list[int]] = {current: list(range(len(own)))}
    start = len(own)
    for tag, records in earlier.items():
        buckets[tag] = list(range(start, start + len(records)))
        start += len(records)
    weights = replay_weights(current, {t: len(v) for t, v in buckets.items()}, settings.share, settings.rule)
    balancer = DomainBalancer(buckets, seed=seed, shuffle=False, weights=weights)
    out: list[dict[str, Any]] = []
    while len(out) < len(own):
        out += [pool[i] for i in balancer.draw(min(per_step, len(own) - len(out)))]
    return out
