"""One sample through its environment, with what every episode of a process shares passed in.

:class:`RolloutContext` holds the shared parts (the engine's HTTP session, the tokenizer, the env
instances, the expert table), built once and closed once: env ``aclose()`` runs when the context
closes. :func:`run_sample` and :func:`score_sample` are the plain functions slime's generate and
reward hooks (:mod:`aclarena_slime.slime_edge.rollout`) call, for training and for slime's own eval
during training; the local backend's rollouts and held-out evaluation run them too. The standalone
evaluation (``aclarena eval run``, the forgetting monitor) does not come through here: it runs the
same agent loop (:func:`aclarena_slime.agent_loop.run_episode`) with each dataset's own settings
(:mod:`aclarena_slime.evaluation.runner`). Samples are slime's ``Sample`` or anything with the same fields.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from aclarena_slime.adapter_swap import AdapterLedger, ServedVersion
from aclarena_slime.agent_loop import ABORTED, FAILED, LoopSettings, Trajectory, run_episode
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.experts import ExpertTable
from aclarena_slime.plugin.contract import Done, Environment, Task
from aclarena_slime.plugin.registry import get_environment
from aclarena_slime.sglang_client import RetryPolicy, SGLangClient, new_session

RECORD_KEY = "aclarena"
RESPONSE_BUDGETS = ("total", "per_turn")  # what max_response_len bounds; see Budgets


def response_budget_mode(value: str | None) -> str:
    """The recipe's ``aclarena_response_budget`` (``total`` when unset), checked: the one check of it."""
    mode = value or "total"
    if mode not in RESPONSE_BUDGETS:
        raise ValueError(f"aclarena_response_budget must be one of {', '.join(RESPONSE_BUDGETS)}, got {value!r}")
    return mode


class MissingEnvTag(ValueError):
    pass


@dataclass(frozen=True)
class Budgets:
    """The token budgets of a run; ``mode`` says what ``max_response_len`` bounds.

    ``total``: all turns together, observations included; ``per_turn``: each model turn on its own
    (as the authors' multi-turn scripts spend ``max_new_tokens``). The context caps bound prompt +
    response (training and evaluation may differ).
    """

    max_response_len: int
    mode: str = "total"
    max_context_len: int | None = None
    eval_max_context_len: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", response_budget_mode(self.mode))  # unset (None) is total


def loop_settings(
    budgets: Budgets,
    sampling_params: Mapping[str, Any],
    evaluation: bool = False,
    lora_path: str | None = None,
    max_turns: int | None = None,
) -> LoopSettings:
    """The agent loop's settings, the one builder every caller uses (rollout, evaluation, gold-demo replay):
    ``sampling_params["max_new_tokens"]`` (slime's eval passes each dataset's own there) wins over the run's
    response budget; ``max_turns`` overrides the env's own limit."""
    budget = int(sampling_params.get("max_new_tokens") or budgets.max_response_len)
    context = (budgets.eval_max_context_len if evaluation else None) or budgets.max_context_len
    return LoopSettings(
        max_response_tokens=budget if budgets.mode == "total" else None,
        max_turn_tokens=budget if budgets.mode == "per_turn" else None,
        max_context_tokens=int(context) if context else None,
        lora_path=lora_path,
        max_turns=max_turns,
    )


def load_chat_tokens(hf_checkpoint: str, template_kwargs: Mapping[str, Any] | None = None) -> ChatTokens:
    """The tokenizer at ``hf_checkpoint`` with the chat template's extra arguments (e.g. ``enable_thinking``)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(hf_checkpoint, trust_remote_code=True)
    return ChatTokens(tokenizer, dict(template_kwargs or {}))


@dataclass
class RolloutContext:
    """What every episode of one process shares; built once, closed once (``async with`` or :meth:`aclose`).

    The HTTP session is made on the event loop of the first request and belongs to it; env instances
    are built on first use of their tag, one per tag, and closed with the context; the tokenizer is
    loaded by the first rollout (scoring a dumped sample needs none).
    """

    engine_url: str
    load_chat: Callable[[], ChatTokens]
    budgets: Budgets
    env_configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    experts: ExpertTable | None = None  # when set, requests carry lora_path = the expert of the env tag
    # When set, each episode is pinned to the expert's current version (``search@12``) for all its turns
    # and its sample records that version and its staleness (see aclarena_slime.adapter_swap).
    ledger: AdapterLedger | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # how long a request waits for its engine
    envs: dict[str, Environment] = field(default_factory=dict)
    session: aiohttp.ClientSession | None = None
    loop: asyncio.AbstractEventLoop | None = None
    _chat: ChatTokens | None = None

    @property
    def chat(self) -> ChatTokens:
        if self._chat is None:
            self._chat = self.load_chat()
        return self._chat

    def env(self, tag: str) -> Environment:
        if tag not in self.envs:
            self.envs[tag] = get_environment(tag, dict(self.env_configs.get(tag) or {}))
        return self.envs[tag]

    def client(self, url: str | None = None) -> SGLangClient:
        """A client on the shared session (the engine's, or ``url``: a teacher's)."""
        loop = asyncio.get_running_loop()
        if self.session is None:
            self.session, self.loop = new_session(), loop
        elif self.loop is not loop:
            raise RuntimeError("a RolloutContext belongs to the event loop it first ran on; build one per loop")
        return SGLangClient(url or self.engine_url, retry=self.retry, session=self.session)

    def adapter(self, tag: str) -> str | None:
        return self.experts.adapter_for(tag) if self.experts is not None else None

    def pinned_adapter(self, tag: str) -> tuple[str | None, ServedVersion | None]:
        """The name an episode of ``tag`` requests for all its turns, and its version when versioned
        (a ledger without the adapter yet: the plain name, as loaded at start)."""
        name = self.adapter(tag)
        version = self.ledger.current(name) if self.ledger is not None and name is not None else None
        return (name if version is None else version.served), version

    async def aclose(self) -> None:
        """Close every env built here and the HTTP session; the context is empty afterwards."""
        envs, self.envs = list(self.envs.values()), {}
        session, self.session, self.loop = self.session, None, None
        try:
            for env in envs:
                await env.aclose()
        finally:
            if session is not None:
                await session.close()

    async def __aenter__(self) -> RolloutContext:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.aclose()


async def run_sample(
    context: RolloutContext, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False
) -> Any:
    """Roll out one sample through its environment; fills the token fields, status and metadata."""
    tag = env_tag(sample)
    env = context.env(tag)
    lora_path, version = context.pinned_adapter(tag)
    settings = loop_settings(context.budgets, sampling_params, evaluation, lora_path=lora_path)
    traj = await run_episode(env, task_of(sample), context.client(), context.chat, sampling_params, settings)
    fill_sample(sample, traj, context.chat, floor_reward=env.reward_range[0])
    if version is not None:
        assert context.ledger is not None
        now = context.ledger.current(version.adapter)
        sample.metadata[RECORD_KEY]["adapter"] = {
            "name": version.served,
            "version": version.version,
            "staleness": (now.version if now is not None else version.version) - version.version,
        }
    if evaluation and traj.score is not None:
        # Evaluation scores the task, whatever reward model training uses (MOPD's is the teacher's KL):
        # slime skips the reward model for a sample that already has a reward.
        sample.reward = float(traj.score.reward)
    return sample


async def score_sample(context: RolloutContext, sample: Any) -> float:
    """The episode's reward: the score computed by :func:`run_sample`, or a replay of its turns.

    Replay covers samples that did not come through :func:`run_sample` (slime's own generate, a dumped
    rollout): their model turns are stepped through a fresh episode and scored.
    """
    record = sample.metadata.setdefault(RECORD_KEY, {})
    if "score" in record:
        return float(record["score"]["reward"])
    env = context.env(env_tag(sample))
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
