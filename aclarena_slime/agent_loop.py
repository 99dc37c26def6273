"""The one generic multi-turn agent loop, token-in/token-out, for every environment.

Plain values in, plain values out: :func:`run_episode` knows nothing of slime. The slime edge
(:mod:`aclarena_slime.slime_edge.rollout`) pulls what it needs out of ``args`` into a rollout context,
and :func:`aclarena_slime.rollout.run_sample` calls this loop with it.

Invariants of the returned :class:`Trajectory`: ``len(loss_mask) == len(log_probs) ==
len(response_ids)``; model tokens carry mask 1 and their engine log-probs exactly; observation tokens
carry mask 0 and log-prob 0.0.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from aclarena_slime.adapter_swap import split_version
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.plugin.contract import Done, Environment, EpisodeAborted, Observation, Score, Task
from aclarena_slime.sglang_client import SGLangClient, SGLangError, finish_reason, output_tokens
from aclarena_slime.sglang_errors import is_adapter_missing

log = logging.getLogger(__name__)

COMPLETED, TRUNCATED, ABORTED, FAILED = "completed", "truncated", "aborted", "failed"

_SURROGATE = re.compile("[\ud800-\udfff]")  # in a Python str every surrogate code point is a lone one


def valid_unicode(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with lone surrogates in their string fields replaced by U+FFFD.

    Text that reaches the tokenizer must be valid Unicode: an env that echoes a model-written
    ``"\\ud800"`` JSON escape would otherwise make the chat template raise, and the sample would be
    removed, a reward-free exit the policy could learn. Messages without surrogates are kept as they are.
    """
    out = []
    for message in messages:
        if isinstance(message, dict) and any(isinstance(v, str) and _SURROGATE.search(v) for v in message.values()):
            message = {k: _SURROGATE.sub("\ufffd", v) if isinstance(v, str) else v for k, v in message.items()}
        out.append(message)
    return out


@dataclass
class Trajectory:
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    status: str = COMPLETED
    end_reason: str = ""
    turns: list[str] = field(default_factory=list)  # the model's turns as text
    messages: list[dict[str, Any]] = field(default_factory=list)  # the whole conversation
    tools: list[dict[str, Any]] | None = None
    score: Score | None = None
    error: str | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add(self, ids: list[int], log_probs: list[float] | None, trainable: bool) -> None:
        self.response_ids += ids
        self.loss_mask += [1 if trainable else 0] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)

    def record(self) -> dict[str, Any]:
        """What the sample's metadata keeps: enough to re-score, inspect, or turn into SFT data."""
        out: dict[str, Any] = {"turns": self.turns, "messages": self.messages, "end": self.end_reason}
        if self.tools:
            out["tools"] = self.tools
        if self.score is not None:
            out["score"] = {"reward": self.score.reward, "breakdown": self.score.breakdown}
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class LoopSettings:
    """The loop's token budgets; each None means "no limit of this kind".

    ``max_response_tokens`` bounds everything after the prompt (model turns and observations together);
    ``max_turn_tokens`` bounds each model turn on its own (what the authors' multi-turn generate functions
    do: ``max_new_tokens`` per turn); ``max_context_tokens`` bounds prompt + response, the whole context the
    engine sees. A model turn gets the smallest of the three that apply.
    """

    max_response_tokens: int | None
    lora_path: str | None = None
    max_turns: int | None = None  # overrides the env's own limit when set
    max_turn_tokens: int | None = None
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_response_tokens", "max_turn_tokens", "max_context_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"LoopSettings.{name} must be at least 1 (or None for no limit), got {value}")
        if self.max_response_tokens is None and self.max_turn_tokens is None:
            raise ValueError("LoopSettings needs a response budget: max_response_tokens or max_turn_tokens")

    def room(self, traj: Trajectory) -> tuple[int, str]:
        """Tokens that may still be appended to the response, and the limit that binds first."""
        limits = []
        if self.max_response_tokens is not None:
            limits.append((self.max_response_tokens - len(traj.response_ids), "response_budget"))
        if self.max_context_tokens is not None:
            limits.append((self.max_context_tokens - len(traj.prompt_ids) - len(traj.response_ids), "context_limit"))
        return min(limits, default=(_UNLIMITED, ""))

    def turn_budget(self, traj: Trajectory) -> tuple[int, str]:
        """``max_new_tokens`` of the next model turn, and the limit that sets it."""
        room, why = self.room(traj)
        if self.max_turn_tokens is not None and self.max_turn_tokens <= room:
            return self.max_turn_tokens, "turn_budget"
        return room, why


_UNLIMITED = 1 << 62


async def run_episode(
    env: Environment,
    task: Task,
    client: SGLangClient,
    chat: ChatTokens,
    sampling_params: dict[str, Any],
    settings: LoopSettings,
) -> Trajectory:
    """Roll out one episode and score it (unless the engine or an env service aborted it)."""
    traj = Trajectory()
    try:
        episode = await env.start(task)
    except EpisodeAborted as exc:
        return _ended(_with_task_prompt(traj, task, chat), ABORTED, "env_aborted", str(exc))
    except Exception as exc:  # noqa: BLE001 - an env bug fails this sample, not the rollout
        log.exception("env %s failed to start an episode", type(env).__name__)
        return _ended(_with_task_prompt(traj, task, chat), FAILED, "env_error", f"{type(exc).__name__}: {exc}")
    try:
        return await _drive(env, episode, traj, client, chat, sampling_params, settings)
    finally:
        await episode.close()


async def _drive(env, episode, traj, client, chat, sampling_params, settings) -> Trajectory:
    try:
        traj.messages = valid_unicode(list(episode.conversation.messages))
        traj.tools = episode.conversation.tools
        traj.prompt_ids = chat.prompt_ids(traj.messages, traj.tools)
    except Exception as exc:  # noqa: BLE001 - the env's messages do not render: fail this sample only
        return _render_failed(env, traj, "prompt", exc)
    params = dict(sampling_params)
    if env.stop:
        params["stop"] = list(dict.fromkeys(list(params.get("stop") or []) + list(env.stop)))
    max_turns = settings.max_turns or env.max_turns
    for turn in range(max_turns):
        budget, limit = settings.turn_budget(traj)
        if budget <= 0:
            return await _finish(episode, traj, TRUNCATED, limit)
        params["max_new_tokens"] = budget
        try:
            response = await client.generate(traj.tokens, params, lora_path=settings.lora_path)
        except SGLangError as exc:
            # The client has already waited out an engine restart (RetryPolicy); what reaches here fails the
            # rollout, as slime's own generate does, the error naming the engine.
            pinned = settings.lora_path is not None and split_version(settings.lora_path)[1] is not None
            if not pinned or not is_adapter_missing(exc.status, exc.message):
                raise
            # The episode's adapter version was unloaded between its turns (it fell behind the staleness
            # budget): the episode ends here and is not trained on.
            return _ended(traj, ABORTED, "adapter_retired", exc.message)
        ids, log_probs = output_tokens(response)
        traj.add(ids, log_probs, trainable=True)
        reason = finish_reason(response)
        if reason == "abort":
            return _ended(traj, ABORTED, "engine_abort", None)
        text = chat.turn_text(ids)
        traj.turns.append(text)
        traj.messages.append({"role": "assistant", "content": text})
        if reason == "length":
            return await _finish(episode, traj, TRUNCATED, limit)
        try:
            result = await episode.step(text)
        except EpisodeAborted as exc:
            return _ended(traj, ABORTED, "env_aborted", str(exc))
        except Exception as exc:  # noqa: BLE001
            log.exception("env %s failed on a step", type(env).__name__)
            return _ended(traj, FAILED, "env_error", f"{type(exc).__name__}: {exc}")
        if isinstance(result, Done):
            return await _finish(episode, traj, COMPLETED, result.reason)
        if not isinstance(result, Observation):
            return _ended(traj, FAILED, "env_error", f"step returned {type(result).__name__}, not Observation or Done")
        if turn + 1 == max_turns:
            break
        room, limit = settings.room(traj)
        try:
            observation = cut_observation(valid_unicode(result.messages), room)
            obs_ids = chat.observation_ids(observation, ids[-1] if ids else None)
        except Exception as exc:  # noqa: BLE001
            return _render_failed(env, traj, "observation", exc)
        traj.messages += observation
        traj.add(obs_ids[: max(room, 0)], None, trainable=False)
        if len(obs_ids) >= room:
            return await _finish(episode, traj, TRUNCATED, limit)
    return await _finish(episode, traj, TRUNCATED, "turn_limit")


async def _finish(episode, traj: Trajectory, status: str, reason: str) -> Trajectory:
    try:
        traj.score = await episode.score()
    except EpisodeAborted as exc:
        return _ended(traj, ABORTED, "env_aborted", str(exc))
    except Exception as exc:  # noqa: BLE001
        log.exception("env failed to score an episode")
        return _ended(traj, FAILED, "score_error", f"{type(exc).__name__}: {exc}")
    traj.status, traj.end_reason = status, reason
    return traj


def _render_failed(env: Environment, traj: Trajectory, what: str, exc: Exception) -> Trajectory:
    """An env message the chat template cannot render (content None, a bad role, a jinja error) is the
    env's bug: the sample fails with the reason, the rollout goes on."""
    log.exception("the chat template cannot render the %s of env %s", what, type(env).__name__)
    return _ended(traj, FAILED, "render_error", f"cannot render the env's {what}: {type(exc).__name__}: {exc}")


def _with_task_prompt(traj: Trajectory, task: Task, chat: ChatTokens) -> Trajectory:
    """An episode the env could not start still carries its prompt's tokens (the record's own prompt, rendered):
    slime's sample needs a non-empty ``tokens`` even when the sample is removed."""
    messages = task.prompt if isinstance(task.prompt, list) else [{"role": "user", "content": str(task.prompt)}]
    try:
        traj.prompt_ids = chat.prompt_ids(valid_unicode(list(messages)))
    except Exception:  # noqa: BLE001 - a prompt the template cannot render: its plain text's tokens
        traj.prompt_ids = chat.encode(str(task.prompt))
    return traj


def _ended(traj: Trajectory, status: str, reason: str, error: str | None) -> Trajectory:
    traj.status, traj.end_reason, traj.error = status, reason, error
    return traj


_CHARS_PER_TOKEN = 16  # well above any text's average (English runs near 4): a cut never binds before the room


def cut_observation(messages: list[dict[str, Any]], room: int) -> list[dict[str, Any]]:
    """``messages`` with each text cut to ``room`` tokens' worth of characters, before it is tokenized: a
    20 MB passage or reply would otherwise be tokenized whole on the rollout's event loop, stalling it."""
    cap = max(room, 0) * _CHARS_PER_TOKEN
    return [
        {**m, "content": m["content"][:cap]} if isinstance(m.get("content"), str) and len(m["content"]) > cap else m
        for m in messages
    ]
