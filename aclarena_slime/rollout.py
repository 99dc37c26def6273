"""The slime-facing functions: the only module that knows slime's signatures.

Point slime at them by dotted path::

    --custom-generate-function-path aclarena_slime.rollout.generate
    --custom-rm-path aclarena_slime.rollout.reward

What they read from ``args`` (everything else is passed on as plain values):

- ``sglang_router_ip``, ``sglang_router_port``: the engine endpoint (slime's router, or one server);
- ``hf_checkpoint``: where the tokenizer lives;
- ``rollout_max_response_len``: the response budget across all turns (observations included);
- ``aclarena_env_config`` (optional, from ``--custom-config-path``): ``{tag: {env settings}}``;
- ``aclarena_experts`` (optional): an ``experts.json`` path or a ``{tag: adapter_name}`` mapping; when
  set, every request carries ``lora_path`` = the expert of the sample's env tag.

Samples are slime's ``Sample`` or anything with the same fields (tests use a duck-typed one).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from aclarena_slime.agent_loop import ABORTED, FAILED, LoopSettings, Trajectory, run_episode
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.contract import Done, Task
from aclarena_slime.experts import ExpertTable
from aclarena_slime.registry import get_environment
from aclarena_slime.sglang_client import SGLangClient

RECORD_KEY = "aclarena"


class MissingEnvTag(ValueError):
    pass


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """Roll out one sample through its environment; fills the token fields, status and metadata."""
    tag = env_tag(sample)
    env = get_environment(tag, env_config(args, tag))
    settings = LoopSettings(
        max_response_tokens=int(args.rollout_max_response_len),
        lora_path=expert_adapter(args, tag),
    )
    client = SGLangClient.from_host_port(args.sglang_router_ip, args.sglang_router_port)
    chat = chat_tokens(args.hf_checkpoint)
    traj = await run_episode(env, task_of(sample), client, chat, sampling_params, settings)
    fill_sample(sample, traj, chat, floor_reward=env.reward_range[0])
    return sample


async def reward(args: Any, sample: Any, **_: Any) -> float:
    """The episode's reward: the score computed at the end of ``generate``, or a replay of its turns.

    Replay covers samples that did not come through :func:`generate` (e.g. slime's own generate,
    or a dumped rollout): their model turns are stepped through a fresh episode and scored.
    """
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


@functools.lru_cache(maxsize=4)
def chat_tokens(hf_checkpoint: str) -> ChatTokens:
    from transformers import AutoTokenizer

    return ChatTokens(AutoTokenizer.from_pretrained(hf_checkpoint, trust_remote_code=True))


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
