"""Rollout-side hooks (they run in slime's RolloutManager): generate, reward, reward post-process, rollout log,
filters.

What they read from ``args``: ``sglang_router_ip`` / ``sglang_router_port`` (the engine),
``hf_checkpoint`` (the tokenizer), ``apply_chat_template_kwargs``, ``rollout_max_response_len``,
``rollout_max_context_len`` / ``eval_max_context_len``, ``reward_key``, the group-normalization flags,
and from the custom config ``aclarena_env_config`` ({tag: env settings}), ``aclarena_experts`` (an
``experts.json`` path or {tag: adapter}: requests carry ``lora_path`` = the expert of the sample's env),
``aclarena_response_budget``, ``aclarena_filters``, ``aclarena_guards``, ``aclarena_engine`` (how long a request
waits for its engine), and ``aclarena_lora`` (with ``staleness_budget`` set, each
episode is pinned to the adapter version current when it starts, read from the ledger in ``sync_dir``).

**One rollout context per process.** Slime loads the generate function by dotted path at every call
and runs every call on one event loop, a daemon thread it starts once per process
(``slime/utils/async_utils.py``); its ``GenerateState`` singleton (``slime/rollout/sglang_rollout.py``)
keeps its own state across calls the same way. So the context (HTTP session, tokenizer, env
instances, expert table) is built on the first call and kept here, for the ``args`` and the loop it
was built for. Slime has no shutdown hook for rollout plugins (``RolloutManager.dispose`` stops its
health monitors and tracking only), so the context is closed at interpreter exit, on the loop it
belongs to, while that loop still runs (:func:`_close_at_exit`); a caller that owns its loop (a test,
a tool) closes it with :func:`close_context`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import logging
from collections.abc import Mapping
from typing import Any

from aclarena_slime import group_rewards, rollout_guard
from aclarena_slime.adapter_swap import AdapterLedger
from aclarena_slime.experts import ExpertTable
from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.rollout import Budgets, RolloutContext, env_tag, load_chat_tokens, run_sample, score_sample
from aclarena_slime.slime_edge import custom

log = logging.getLogger(__name__)
_SHUTDOWN_TIMEOUT_S = 30.0

_current: RolloutContext | None = None
_current_key: tuple[Any, asyncio.AbstractEventLoop] | None = None  # the args and the loop it was built for
_exit_hook_installed = False


def build_context(args: Any) -> RolloutContext:
    """The rollout context of ``args``: every value the episodes share, read from ``args`` once."""
    experts = getattr(args, "aclarena_experts", None)  # empty or unset: the base model serves every tag
    table = None
    if isinstance(experts, Mapping) and experts:
        table = ExpertTable.from_mapping(experts)
    elif experts and not isinstance(experts, Mapping):
        table = ExpertTable.load(str(experts))
    return RolloutContext(
        engine_url=f"http://{args.sglang_router_ip}:{args.sglang_router_port}",
        load_chat=functools.partial(
            load_chat_tokens, args.hf_checkpoint, getattr(args, "apply_chat_template_kwargs", None)
        ),
        budgets=Budgets(
            max_response_len=int(args.rollout_max_response_len),
            mode=custom.response_budget(args),
            max_context_len=getattr(args, "rollout_max_context_len", None),
            eval_max_context_len=getattr(args, "eval_max_context_len", None),
        ),
        env_configs=dict(getattr(args, "aclarena_env_config", None) or {}),
        experts=table,
        ledger=_ledger(args),
        retry=custom.engine(args),
    )


def _ledger(args: Any) -> AdapterLedger | None:
    """With versioned adapters (``lora.staleness_budget``), the ledger the trainer's syncs write: each episode
    is pinned to the version current when it starts."""
    if not getattr(args, "aclarena_lora", None):
        return None
    config = LoraConfig.from_args(args)
    if config.staleness_budget is None:
        return None
    config.require_sync_dir()
    return AdapterLedger(str(config.sync_dir))


async def rollout_context(args: Any) -> RolloutContext:
    """This process's context for ``args``, built on first use (see the module docstring)."""
    global _current, _current_key, _exit_hook_installed
    loop = asyncio.get_running_loop()
    if _current is not None and (_current_key is None or _current_key[0] is not args or _current_key[1] is not loop):
        await close_context()  # another run's args, or a new loop (a test, a tool): the old one ends here
    if _current is None:
        _current, _current_key = build_context(args), (args, loop)
        if not _exit_hook_installed:
            atexit.register(_close_at_exit)
            _exit_hook_installed = True
    return _current


async def close_context() -> None:
    """Close this process's context (its envs' ``aclose`` and the HTTP session); the next call builds anew.

    A context built on a loop that has ended (with its test or tool) is closed here as far as it can
    be: its envs' ``aclose`` runs, its HTTP session went with its loop.
    """
    global _current, _current_key
    context, key, _current, _current_key = _current, _current_key, None, None
    if context is None:
        return
    if key is not None and key[1] is not asyncio.get_running_loop():
        context.session = None
    await context.aclose()


def _close_at_exit() -> None:
    """At interpreter exit: close the context on slime's loop (a daemon thread that still runs then)."""
    global _current, _current_key
    context, key, _current, _current_key = _current, _current_key, None, None
    if context is None or key is None:
        return
    loop = key[1]
    try:
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(context.aclose(), loop).result(_SHUTDOWN_TIMEOUT_S)
        elif not loop.is_closed():
            loop.run_until_complete(context.aclose())
    except (concurrent.futures.TimeoutError, RuntimeError, OSError) as exc:
        log.warning("rollout context did not close cleanly at exit: %r", exc)


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """slime ``--custom-generate-function-path``: roll out one sample through its environment.

    Parallel MLE (``aclarena_lora.experts``): a training sample also carries its env's adapter index to the
    Megatron actor (:mod:`aclarena_slime.lora.routing`)."""
    result = await run_sample(await rollout_context(args), sample, sampling_params, evaluation)
    experts = (getattr(args, "aclarena_lora", None) or {}).get("experts")
    if experts and not evaluation:
        from aclarena_slime.lora.routing import tag_sample

        for one in result if isinstance(result, list) else [result]:
            tag_sample(one, experts, env_tag(one))
    return result


async def reward(args: Any, sample: Any, **_: Any) -> float | list[float]:
    """slime ``--custom-rm-path``: the episode's reward (with ``--group-rm``, a list for a list)."""
    context = await rollout_context(args)
    if isinstance(sample, list):
        return list(await asyncio.gather(*(score_sample(context, one) for one in sample)))
    return await score_sample(context, sample)


def group_normalization(args: Any) -> group_rewards.GroupNormalization:
    return group_rewards.GroupNormalization(
        estimator=getattr(args, "advantage_estimator", "grpo"),
        enabled=bool(getattr(args, "rewards_normalization", True)),
        std=bool(getattr(args, "grpo_std_normalization", True)),
        group_size=int(getattr(args, "n_samples_per_prompt", 1) or 1),
    )


_health: tuple[Any, rollout_guard.RolloutHealth] | None = None  # the run's args and its batches so far
_refill: tuple[Any, rollout_guard.RefillBound] | None = None  # the run's args and the filter's drops in a row


def rollout_health(args: Any) -> rollout_guard.RolloutHealth:
    """The training batches of the run of ``args`` (one RolloutManager process, one run)."""
    global _health
    if _health is None or _health[0] is not args:
        _health = (args, rollout_guard.RolloutHealth(custom.guards(args)))
    return _health[1]


def refill_bound(args: Any) -> rollout_guard.RefillBound:
    """The group filter's drops in a row for the run of ``args``; a round is what slime asks its data source
    for each time it refills (``over_sampling_batch_size``, else ``rollout_batch_size`` groups)."""
    global _refill
    if _refill is None or _refill[0] is not args:
        size = getattr(args, "over_sampling_batch_size", None) or getattr(args, "rollout_batch_size", None) or 1
        _refill = (args, rollout_guard.RefillBound(custom.guards(args), round_size=int(size)))
    return _refill[1]


def reward_post_process(args: Any, samples: list[Any], **_: Any) -> tuple[list[float], list[float]]:
    """slime ``--custom-reward-post-process-path``: ``(raw_rewards, rewards)`` as slime's default computes
    them, except that removed samples stay out of their group's mean and std and get 0.0.

    slime calls it once per training batch, which makes it the place to see a batch whole: one that lost
    most of its samples is logged at WARNING, and several in a row stop the job (:mod:`rollout_guard`)."""
    rollout_health(args).observe(samples)
    key = getattr(args, "reward_key", None)
    raw = [group_rewards.reward_value(sample, key) for sample in samples]
    return raw, group_rewards.normalized_rewards(samples, raw, group_normalization(args))


def rollout_log(rollout_id: int, args: Any, samples: list[Any], rollout_extra_metrics: Any, rollout_time: float) -> bool:
    """slime ``--custom-rollout-log-function-path``, set by the compiler on rollout-only recipes: on
    ``--debug-rollout-only`` slime's ``RolloutManager.generate`` returns before the reward post-process, and this
    is the hook it calls with each batch whole (after dumping it). The lost-batch guard runs here as it does in
    :func:`reward_post_process`. False: slime's own rollout logging goes on."""
    rollout_health(args).observe(samples)
    return False


def drop_no_tool(args: Any, samples: list[Any], **_: Any) -> Any:
    """slime ``--dynamic-sampling-filter-path``: the authors' no-tool filter (``group_rewards.drop_no_tool``);
    too many groups dropped in a row stop the job (:func:`refill_bound`: slime's refill loop has no cap)."""
    keep, reason = group_rewards.drop_no_tool(samples, custom.filters(args).max_no_tool_fraction)
    refill_bound(args).judged(keep, reason)
    return filter_output(keep, reason)


def reward_nonzero_std(args: Any, samples: list[Any], **_: Any) -> Any:
    """slime ``--dynamic-sampling-filter-path``: slime's own ``check_reward_nonzero_std`` rule (the math and IF
    stages': keep a group only if its rewards differ, ``group_rewards.reward_nonzero_std``), behind
    :func:`refill_bound`: slime's filter has none, so a model whose groups all score alike spun for ever."""
    keep, reason = group_rewards.reward_nonzero_std(samples, getattr(args, "reward_key", None))
    refill_bound(args).judged(keep, reason)
    return filter_output(keep, reason)


def task_reward_nonzero_std(args: Any, samples: list[Any], **_: Any) -> Any:
    """slime ``--dynamic-sampling-filter-path``: keep a group only if its task outcomes differ."""
    keep, reason = group_rewards.task_reward_nonzero_std(samples, getattr(args, "reward_key", None))
    refill_bound(args).judged(keep, reason)
    return filter_output(keep, reason)


def filter_output(keep: bool, reason: str | None) -> Any:
    """slime's ``DynamicFilterOutput`` (it counts drops by reason); a bare bool where slime is absent."""
    try:
        from slime.rollout.filter_hub.base_types import DynamicFilterOutput
    except ImportError:
        return keep
    return DynamicFilterOutput(keep=keep, reason=reason)
