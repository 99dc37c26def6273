"""The records of a local stage: read, split into training and held-out, mixed for replay, made into samples.

Records are slime JSONL (``prompt``, ``label``, ``metadata.env``) read from a file, or the env's
generated ``demo_records`` when no file is named (no downloads). Env settings may name the engine
(:func:`bind_engine`); the replay baseline's mixture (:func:`replay_mixture`) uses the same balancer and
weights as slime's balanced data source.
"""

from __future__ import annotations

import json
import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aclarena_slime.distill.balanced_source import DomainBalancer, ReplaySettings, replay_weights
from aclarena_slime.evaluation.suite import HELD_OUT_DEMOS, HELD_OUT_SEED
from aclarena_slime.jsonl import JsonlError, iter_jsonl
from aclarena_slime.plugin.contract import Environment, Task
from aclarena_slime.plugin.registry import get_environment
from aclarena_slime.sample import Sample


class RecordError(ValueError):
    """Records that cannot feed the stage; the message names the file and line."""


def read_jsonl(path: str | Path, tag: str, check_label: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """Records of ``path``; each gets ``metadata.env = tag`` when it has none, and a mismatch is an error, as is a
    label ``check_label`` (the env's :meth:`~aclarena_slime.plugin.contract.Environment.check_label`) refuses."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"data file {path} does not exist")
    try:
        records = [_checked(record, tag, f"{path}:{n}", check_label) for n, record in iter_jsonl(path)]
    except JsonlError as exc:
        raise RecordError(str(exc)) from None
    if not records:
        raise RecordError(f"data file {path} holds no records")
    return records


def demo_records(env: Environment, n: int, seed: int) -> list[dict[str, Any]]:
    try:
        records = env.demo_records(n, seed=seed)
    except NotImplementedError as exc:
        raise RecordError(f"{exc}; set data_path (and eval_data_path) for the local stage") from exc
    return [_checked(r, env.tag, f"demo record {i}", env.check_label) for i, r in enumerate(records)]


def _checked(record: Any, tag: str, where: str, check_label: Callable[[Any], None] | None = None) -> dict[str, Any]:
    if not isinstance(record, dict) or "prompt" not in record:
        raise RecordError(f"{where}: a record must be an object with a 'prompt'")
    metadata = dict(record.get("metadata") or {})
    if metadata.setdefault("env", tag) != tag:
        raise RecordError(f"{where}: record is for env {metadata['env']!r}, but this stage trains {tag!r}")
    if check_label is not None:
        try:
            check_label(Task(prompt=record["prompt"], label=record.get("label")).label_value)
        except ValueError as exc:
            raise RecordError(f"{where}: bad label for env {tag!r}: {exc}") from None
    return {**record, "metadata": metadata}


def take(records: list[dict[str, Any]], n: int, rng: random.Random) -> list[dict[str, Any]]:
    """``n`` records, reshuffled on every pass through ``records`` (a seeded epoch order)."""
    out: list[dict[str, Any]] = []
    while len(out) < n:
        order = list(records)
        rng.shuffle(order)
        out += order[: n - len(out)]
    return out


def new_sample(record: dict[str, Any], group: int, index: int) -> Sample:
    return Sample(
        group_index=group,
        index=index,
        prompt=record["prompt"],
        label=record.get("label"),
        metadata=json.loads(json.dumps(record["metadata"])),  # a private copy: the rollout writes into it
    )


def bind_engine(config: Mapping[str, Any], url: str, served_name: str) -> dict[str, Any]:
    """``config`` with the engine placeholders in its strings replaced (nested too): ``{local_engine}`` by the
    engine's base URL, ``{local_model}`` by its served model name (e.g. a user simulator served by it)."""

    def bind(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{local_engine}", url).replace("{local_model}", served_name)
        if isinstance(value, Mapping):
            return {k: bind(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [bind(v) for v in value]
        return value

    return bind(dict(config))


@dataclass(frozen=True)
class StageRecords:
    """The stage's records: RL (or SFT teacher) prompts, warm-start prompts, validation prompts and held-out
    evaluation prompts.

    No training record (RL or warm start) shares a prompt with an evaluation record: those found in
    the training source are dropped and counted in ``overlap_dropped``. Only when that would leave
    nothing to train on (an env with a handful of prompts) are they kept, with a warning and
    ``held_out`` False. The validation records come out of the RL records (``validation_size``): no
    training prompt, no held-out prompt; settings are chosen on them, never on the held-out ones.
    """

    train: list[dict[str, Any]]
    warm_start: list[dict[str, Any]]
    evaluation: list[dict[str, Any]]
    overlap_dropped: int
    held_out: bool = True  # False: no training prompt was left once the evaluation prompts were taken out
    validation: list[dict[str, Any]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "train": len(self.train),
            "warm_start": len(self.warm_start),
            "validation": len(self.validation),
            "evaluation": len(self.evaluation),
            "overlap_dropped": self.overlap_dropped,
            "held_out": self.held_out,
        }


@dataclass(frozen=True)
class RecordSettings:
    """What the stage's records are made of (:func:`aclarena_slime.local.records.stage_records`): its env and the env's
    settings, the data files (None: demo records), the held-out, warm-start and validation counts, the RL prompts
    (``train_prompts``: steps x the prompts a round), and the replay baseline's settings."""

    env: str
    env_config: Mapping[str, Any]
    seed: int  # the stage's seed (``cluster.local.seed``): the records' draw, and the session's
    data_path: str | None
    eval_data_path: str | None
    eval_size: int
    train_prompts: int
    warm_start_records: int  # 0: no warm start
    validation_size: int
    replay: Mapping[str, Any]


def stage_records(env: Environment, settings: RecordSettings) -> StageRecords:
    """Evaluation records first (``eval_data_path`` or demo records of the held-out seed), then training ones
    (``data_path`` or the env's demo records) without the held-out prompts, in a seeded order: the warm
    start's, then the validation prompts, then the RL prompts, without the warm start's prompts unless nothing
    else is left (never the validation prompts).

    Demo training records also leave out the demo records the evaluation runner and the forgetting monitor
    check (:data:`~aclarena_slime.evaluation.suite.HELD_OUT_SEED`, at least
    :data:`~aclarena_slime.evaluation.suite.HELD_OUT_DEMOS` of them), whatever the stage's seed and eval size.
    """
    if settings.eval_size == 0:
        evaluation: list[dict[str, Any]] = []
    elif settings.eval_data_path:
        evaluation = read_jsonl(settings.eval_data_path, settings.env, env.check_label)[: settings.eval_size]
    else:
        evaluation = demo_records(env, settings.eval_size, settings.seed + HELD_OUT_SEED)
    held_out = {prompt_key(r) for r in evaluation}
    if not settings.data_path:
        held_out |= checked_keys(env, settings.eval_size)
    n_train = settings.train_prompts
    n_warm = settings.warm_start_records
    n_val = settings.validation_size
    if settings.data_path:
        source = read_jsonl(settings.data_path, settings.env, env.check_label)
    else:  # enough demo records that dropping the held-out and warm-start prompts leaves the ones asked for
        source = demo_records(env, n_train + n_warm + n_val + len(held_out), settings.seed)
    pool = [r for r in source if prompt_key(r) not in held_out]
    disjoint = bool(pool)
    if not disjoint:  # an env with a handful of prompts (a test env): train on them, and say so loudly
        warnings.warn(
            f"every training prompt of env {settings.env!r} is also an evaluation prompt: the evaluation is not held out",
            stacklevel=2,
        )
        pool = list(source)
    # The warm start's records come first (whatever the RL steps: a cached warm start stays valid), the RL
    # prompts after them, those the warm start has not fitted where there are any: a warm-started tiny model
    # answers its own warm-start prompts from memory, and RL on them does not carry to held-out prompts
    # (docs/local-backend.md).
    warm = take(pool[:n_warm], n_warm, random.Random(settings.seed + 1)) if n_warm else []
    seen = {prompt_key(r) for r in warm}
    fresh = [r for r in pool[n_warm:] if prompt_key(r) not in seen]
    # The validation prompts come first (the RL prompts after them stay where they are when the steps change).
    validation = _distinct(fresh, n_val)
    if len(validation) < n_val:
        raise RecordError(
            f"validation_size={n_val}: only {len(validation)} distinct prompts of env {settings.env!r} are neither "
            "warm-start nor held-out prompts; lower validation_size or give more training records"
        )
    checked = {prompt_key(r) for r in validation}
    fresh = [r for r in fresh if prompt_key(r) not in checked]
    if n_val and not fresh:
        raise RecordError(f"validation_size={n_val} leaves no RL prompt of env {settings.env!r}; lower it")
    rl_pool = fresh or pool
    rng = random.Random(settings.seed)
    train = take(rl_pool, n_train, rng) if settings.data_path else rl_pool[:n_train]
    if len(train) < n_train:  # a finite demo set: go through it again
        train = take(rl_pool, n_train, rng)
    return StageRecords(train, warm, evaluation, len(source) - len(pool), disjoint, validation)


def _distinct(records: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The first ``n`` records of distinct prompts (fewer when there are not that many)."""
    out: list[dict[str, Any]] = []
    keys: set[str] = set()
    for record in records:
        if len(out) == n:
            break
        if prompt_key(record) not in keys:
            keys.add(prompt_key(record))
            out.append(record)
    return out


def prompt_key(record: dict[str, Any]) -> str:
    """What makes two records the same question for the held-out split: their prompt."""
    return json.dumps(record.get("prompt"), sort_keys=True)


def stage_env_configs(settings: RecordSettings, url: str, served_name: str) -> dict[str, dict[str, Any]]:
    """The settings of every env the stage runs, bound to its engine at ``url`` serving ``served_name``: its own
    env's first, then each replayed domain's (``settings.replay``'s ``env_config``: what that domain's own stage
    ran with, so the earlier env plays here as it played there, its engine placeholders now naming this stage's
    engine)."""
    replayed = (settings.replay.get("env_config") or {}) if settings.replay.get("enabled") else {}
    configs = {settings.env: settings.env_config, **{t: replayed.get(t) or {} for t in settings.replay.get("domains") or ()}}
    return {tag: bind_engine(config, url, served_name) for tag, config in configs.items()}


def checked_keys(env: Environment, eval_size: int) -> set[str]:
    """The prompts of the held-out seed's demo records, which the evaluation runner and the forgetting monitor
    of later stages check (at least HELD_OUT_DEMOS of them, a monitor's largest ``demo_size``): no stage
    trains on them, in its own records or replaying them."""
    return {prompt_key(r) for r in demo_records(env, max(eval_size, HELD_OUT_DEMOS), HELD_OUT_SEED)}


def replay_mixture(
    settings: RecordSettings,
    own: list[dict[str, Any]],
    env_configs: Mapping[str, Mapping[str, Any]],
    per_step: int,
    domains: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """The replay baseline (``settings.replay``; empty: ``own`` as it is): the earlier domains' demo records mixed
    into the stage's own records, each batch of ``per_step`` (a GRPO step's prompts) holding the
    replay shares (largest remainder). The GRPO phase mixes its prompts with it, the warm start its gold-demo
    records (``per_step``: its batch; ``domains``: the earlier domains with gold demos).

    ``env_configs``: each earlier domain's env settings, bound to the engine (the rollout serves them too).
    No earlier domain's record is one of its held-out prompts (the evaluation runner's, this stage's seed's), unless
    that leaves none (an env with a handful of prompts: then with a warning, as :func:`stage_records` does).
    """
    values = dict(settings.replay or {})
    tags = [t for t in values.get("domains") or () if domains is None or t in domains]
    if not values.get("enabled") or not tags:
        return own
    earlier = {}
    for tag in tags:
        env = get_environment(tag, dict(env_configs.get(tag) or {}))
        own_evaluation = demo_records(env, settings.eval_size, settings.seed + HELD_OUT_SEED) if settings.eval_size else []
        held_out = checked_keys(env, settings.eval_size) | {prompt_key(r) for r in own_evaluation}
        records = demo_records(env, len(own), settings.seed)
        earlier[tag] = [r for r in records if prompt_key(r) not in held_out] or _not_held_out(records, tag)
    return replay_records(values, own, earlier, settings.seed, per_step)


def _not_held_out(records: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """``records``, every one a held-out prompt (an env with a handful of prompts), with the stage's warning."""
    warnings.warn(
        f"every replayed prompt of env {tag!r} is also an evaluation prompt: its evaluation is not held out",
        stacklevel=3,
    )
    return records


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
