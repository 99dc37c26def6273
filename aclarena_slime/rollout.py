"""The slime-facing functions: the only module that knows slime's signatures.

Point slime at them by dotted path::

    --custom-generate-function-path aclarena_slime.rollout.generate
    --custom-rm-path aclarena_slime.rollout.reward
    --custom-reward-post-process-path aclarena_slime.rollout.reward_post_process

What they read from ``args`` (everything else is passed on as plain values):

- ``sglang_router_ip``, ``sglang_router_port``: the engine endpoint (slime's router, or one server);
- ``hf_checkpoint``: where the tokenizer lives;
- ``rollout_max_response_len``: the response budget, unless ``sampling_params["max_new_tokens"]`` gives
  one (slime's eval passes each dataset's own budget there). ``aclarena_response_budget`` says what it
  bounds: ``total`` (the default: all turns together, observations included) or ``per_turn`` (each model
  turn on its own, as the authors' multi-turn scripts spend ``max_new_tokens``);
- ``rollout_max_context_len`` / ``eval_max_context_len`` (optional): a cap on the whole context, prompt +
  response (slime's flags for the engine's context size);
- ``apply_chat_template_kwargs`` (optional): extra keyword arguments of the chat template;
- ``aclarena_env_config`` (optional, from ``--custom-config-path``): ``{tag: {env settings}}``;
- ``aclarena_experts`` (optional): an ``experts.json`` path or a ``{tag: adapter_name}`` mapping; when
  set, every request carries ``lora_path`` = the expert of the sample's env tag.

Samples are slime's ``Sample`` or anything with the same fields (tests use a duck-typed one).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Mapping
from typing import Any

from aclarena_slime.agent_loop import ABORTED, FAILED, LoopSettings, Trajectory, run_episode
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.contract import Done, Task
from aclarena_slime.experts import ExpertTable
from aclarena_slime.group_rewards import normalized_rewards, reward_value
from aclarena_slime.registry import get_environment
from aclarena_slime.sglang_client import SGLangClient

RECORD_KEY = "aclarena"


class MissingEnvTag(ValueError):
    pass


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """Roll out one sample through its environment; fills the token fields, status and metadata."""
    tag = env_tag(sample)
    env = get_environment(tag, env_config(args, tag))
    settings = loop_settings(args, sampling_params, evaluation, lora_path=expert_adapter(args, tag))
    client = SGLangClient.from_host_port(args.sglang_router_ip, args.sglang_router_port)
    chat = chat_tokens(args.hf_checkpoint, _template_kwargs(args))
    traj = await run_episode(env, task_of(sample), client, chat, sampling_params, settings)
    fill_sample(sample, traj, chat, floor_reward=env.reward_range[0])
    if evaluation and traj.score is not None:
        # Evaluation scores the task, whatever reward model training uses (MOPD's is the teacher's KL):
        # slime skips the reward model for a sample that already has a reward.
        sample.reward = float(traj.score.reward)
    return sample


async def reward(args: Any, sample: Any, **_: Any) -> float | list[float]:
    """The episode's reward: the score computed at the end of ``generate``, or a replay of its turns.

    Replay covers samples that did not come through :func:`generate` (e.g. slime's own generate,
    or a dumped rollout): their model turns are stepped through a fresh episode and scored.
    With ``--group-rm`` slime passes a group (a list of samples) and expects a list of rewards.
    """
    if isinstance(sample, list):
        return list(await asyncio.gather(*(_sample_reward(args, one) for one in sample)))
    return await _sample_reward(args, sample)


async def _sample_reward(args: Any, sample: Any) -> float:
    record = sample.metadata.setdefault(RECORD_KEY, {})
    if "score" in record:
        return float(record["score"]["reward"])
    tag = env_tag(sample)
    env = get_environment(tag, env_config(args, tag))
    if record.get("error"):  # the env failed on this sample: a placeholder, never trained on
        return float(env.reward_range[0])
    episode = await env.start(task_of(sample))
    try:
        for text in record.get("turns") or [sample.response]:
            if isinstance(await episode.step(text), Done):
                break
        score = await episode.score()
    finally:
        await episode.close()
    record["score"] = {"reward": score.reward, "breakdown": score.breakdown}
    return float(score.reward)


def reward_post_process(args: Any, samples: list[Any], **_: Any) -> tuple[list[float], list[float]]:
    """slime ``--custom-reward-post-process-path``: ``(raw_rewards, rewards)`` as slime's default computes
    them, except that removed samples (an env failure's placeholder reward) stay out of their group's
    mean and std and get 0.0 (see :mod:`aclarena_slime.group_rewards`)."""
    raw = [reward_value(args, sample) for sample in samples]
    return raw, normalized_rewards(args, samples, raw)


def loop_settings(
    args: Any, sampling_params: dict[str, Any], evaluation: bool = False, lora_path: str | None = None
) -> LoopSettings:
    """The agent loop's budgets from slime's ``args`` (see the module docstring)."""
    budget = int(sampling_params.get("max_new_tokens") or args.rollout_max_response_len)
    mode = getattr(args, "aclarena_response_budget", None) or "total"
    if mode not in RESPONSE_BUDGETS:
        raise ValueError(f"aclarena_response_budget must be one of {', '.join(RESPONSE_BUDGETS)}, got {mode!r}")
    context = getattr(args, "eval_max_context_len", None) if evaluation else None
    context = context or getattr(args, "rollout_max_context_len", None)
    return LoopSettings(
        max_response_tokens=budget if mode == "total" else None,
        max_turn_tokens=budget if mode == "per_turn" else None,
        max_context_tokens=int(context) if context else None,
        lora_path=lora_path,
    )


RESPONSE_BUDGETS = ("total", "per_turn")


def env_tag(sample: Any) -> str:
    metadata = sample.metadata if isinstance(sample.metadata, Mapping) else {}
    tag = metadata.get("env")
    if not tag:
        raise MissingEnvTag("sample.metadata has no 'env' tag; each dataset record needs metadata.env")
    return str(tag)


def task_of(sample: Any) -> Task:
    return Task(prompt=sample.prompt, label=sample.label, metadata=dict(sample.metadata or {}))


def env_config(args: Any, tag: str) -> dict[str, Any]:
    configs = getattr(args, "aclarena_env_config", None) or {}
    return dict(configs.get(tag) or {})


def expert_adapter(args: Any, tag: str) -> str | None:
    source = getattr(args, "aclarena_experts", None)
    if not source:
        return None
    if isinstance(source, Mapping):
        return ExpertTable.from_mapping(source).adapter_for(tag)
    return _manifest(str(source)).adapter_for(tag)


@functools.lru_cache(maxsize=8)
def _manifest(path: str) -> ExpertTable:
    return ExpertTable.load(path)


def _template_kwargs(args: Any) -> str:
    """slime's ``--apply-chat-template-kwargs`` (e.g. ``enable_thinking``) as JSON: a hashable cache key."""
    return json.dumps(getattr(args, "apply_chat_template_kwargs", None) or {}, sort_keys=True)


@functools.lru_cache(maxsize=4)
def chat_tokens(hf_checkpoint: str, template_kwargs: str = "{}") -> ChatTokens:
    """One tokenizer per checkpoint and chat-template arguments (``template_kwargs`` is a JSON object)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_checkpoint, trust_remote_code=True)
    return ChatTokens(tokenizer, json.loads(template_kwargs))


def fill_sample(sample: Any, traj: Trajectory, chat: ChatTokens, floor_reward: float = 0.0) -> None:
    """Write a trajectory into slime's ``Sample`` fields (or a duck-typed equivalent).

    A sample the env failed or aborted gets ``remove_sample`` (slime zeroes its loss mask) and the
    env's lowest reward as a placeholder: slime's metrics need a number, the policy must not learn from it.
    """
    sample.tokens = traj.tokens
    sample.response = chat.turn_text(traj.response_ids)
    sample.response_length = len(traj.response_ids)
    sample.loss_mask = traj.loss_mask
    sample.rollout_log_probs = traj.log_probs
    sample.status = type(sample).Status(traj.status)
    if traj.status in (ABORTED, FAILED) and traj.end_reason != "engine_abort":
        # An env service or env bug, not the policy: never train on it.
        sample.remove_sample = True
        sample.reward = floor_reward
    if not isinstance(sample.metadata, dict):
        sample.metadata = dict(sample.metadata or {})
    sample.metadata[RECORD_KEY] = traj.record()
