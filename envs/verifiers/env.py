"""``verifiers``: a verifiers environment (``load_environment(**env_args)`` of an installed module) as an aclarena env.

Its dataset is the stage's prompts (``data.py``), its rubric the reward, its multi-turn protocol the episode;
the model side stays ours. Each episode runs the env's own ``rollout`` as a task with a :class:`LoopClient` in
the place of the model server: when verifiers asks for a model turn, the episode hands the conversation to
our agent loop (``start``'s conversation, then each ``step``'s observation: the messages verifiers appended
since the last turn, tool results included), and the loop's turn, generated token-in/token-out, answers
verifiers' request. So the sample's tokens are the engine's own and observations are masked, as for every
env. ``score`` runs the rubric on the finished state.

Failures never crash a rollout: a rollout error, an exception the env raises, a rubric function that raises
(verifiers logs it and counts 0) or an env that does not answer within ``timeout_s`` ends the sample as
ABORTED with the reason (never trained on: the env failed, not the model). When our loop stops first (turn
or token limit) verifiers' rollout ends as truncated (``prompt_too_long``) and is scored as far as it went.

Config (recipe ``env_config.verifiers``, :class:`VerifiersConfig`): ``env_id`` (the module), ``env_args``,
``max_turns`` (default: the env's own, else 10), ``timeout_s``, ``reward_range`` (rewards are clamped to it).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aclarena_envs.verifiers.data import TAG, load, records
from aclarena_slime.plugin.contract import (
    Conversation,
    Done,
    Environment,
    Episode,
    EpisodeAborted,
    Observation,
    Score,
    Task,
)
from aclarena_slime.plugin.settings import from_mapping

MODEL = "aclarena"  # the model name verifiers records; the engine is ours

# The rubric's reward functions that raised during this task's scoring (verifiers logs them and counts 0).
_RUBRIC_ERRORS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("rubric_errors", default=None)


class _RubricErrors(logging.Handler):
    """Collects verifiers' "Error calling reward function" log records for the episode being scored."""

    def emit(self, record: logging.LogRecord) -> None:
        errors = _RUBRIC_ERRORS.get()
        message = record.getMessage()
        if errors is not None and "reward function" in message:
            errors.append(message[:300])


_HANDLER = _RubricErrors(logging.ERROR)


@dataclass(frozen=True)
class VerifiersConfig:
    """The env's settings (recipe ``env_config.verifiers``)."""

    env_id: str = ""
    env_args: Mapping[str, Any] = field(default_factory=dict)
    max_turns: int | None = None
    timeout_s: float = 60.0  # the env's answer to a turn (its tools) and the rubric, each
    reward_range: tuple[float, float] = (0.0, 1.0)


def as_dict(message: Any) -> dict[str, Any]:
    """A verifiers message (pydantic) as a chat-template message: text content, tool calls OpenAI-style."""
    raw = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    out: dict[str, Any] = {"role": raw.get("role", "user"), "content": _text(raw.get("content"))}
    if raw.get("tool_call_id"):
        out["tool_call_id"] = raw["tool_call_id"]
    if raw.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in raw["tool_calls"]
        ]
    return out


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts: their text
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


def tool_schema(tool: Any) -> dict[str, Any]:
    """A verifiers ``Tool`` as the OpenAI-style schema a chat template renders."""
    return {"type": "function", "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}


class VerifiersEpisode(Episode):
    def __init__(self, env: VerifiersEnvironment, task: Task) -> None:
        from aclarena_envs.verifiers.client import LoopClient

        self.env, self.task, self.turns = env, task, 0
        self.client = LoopClient()
        self.prompt: list[Any] = []
        self.rollout: asyncio.Task[Any] = asyncio.ensure_future(
            env.vf_env.rollout(env.rollout_input(task), self.client, MODEL, None)
        )
        self.stopped_by_us = False

    async def begin(self) -> None:
        """Wait for verifiers' first request: its messages (system prompt, few-shot, question) and tools."""
        request = await self._next_request()
        if request is None:
            raise EpisodeAborted(f"the verifiers env ended before asking the model: {self._rollout_error()}")
        self.prompt, tools = request
        schemas = [tool_schema(t) for t in tools] if tools else None
        self.conversation = Conversation([as_dict(m) for m in self.prompt], schemas)

    async def step(self, text: str) -> Observation | Done:
        from aclarena_envs.verifiers.client import response_of

        if self.rollout.done():
            return Done("env_done")
        self.turns += 1
        self.client.answer(response_of(text, MODEL, self.turns, self.env.parser))
        request = await self._next_request()
        if request is None:
            self._rollout_error(raise_it=True)
            return Done(str(self.rollout.result().get("stop_condition") or "done"))
        prompt, _ = request
        if prompt[: len(self.prompt)] != self.prompt or len(prompt) <= len(self.prompt):
            raise EpisodeAborted("the verifiers env rewrote the conversation's history; a token-in/token-out episode "
                                 "only grows, so it cannot follow")  # fmt: skip
        appended = prompt[len(self.prompt) + 1 :]  # after the previous prompt and the model's turn
        self.prompt = prompt
        return Observation([self._observed(m) for m in appended])

    async def score(self) -> Score:
        from verifiers.errors import OverlongPromptError

        if not self.rollout.done():  # our loop stopped first: verifiers ends the rollout as truncated
            self.stopped_by_us = True
            self.client.stop(OverlongPromptError("the aclarena agent loop ended the episode (turn or token limit)"))
            await self._bounded(asyncio.shield(self.rollout), "finish its rollout")
        self._rollout_error(raise_it=True)
        state = self.rollout.result()
        errors: list[str] = []
        token = _RUBRIC_ERRORS.set(errors)
        try:
            await self._bounded(self.env.vf_env.rubric.score_rollout(state), "score (its rubric)")
            await self._bounded(self.env.vf_env.rubric.cleanup(state), "clean up after its rubric")
        except EpisodeAborted:
            raise
        except Exception as exc:  # noqa: BLE001 - the rubric itself raised: the env's failure, not the model's
            raise EpisodeAborted(f"the verifiers rubric raised {type(exc).__name__}: {exc}") from exc
        finally:
            _RUBRIC_ERRORS.reset(token)
        if errors:
            raise EpisodeAborted(f"the verifiers rubric failed: {errors[0]}")
        raw = float(state.get("reward") or 0.0)
        low, high = self.env.reward_range
        reward = min(max(raw, low), high) if raw == raw else low
        metrics = {k: float(v) for k, v in (state.get("metrics") or {}).items() if isinstance(v, (int, float))}
        breakdown = {"reward": raw, "metrics": metrics, "stop": state.get("stop_condition"), "truncated": self.stopped_by_us}
        return Score(reward, breakdown)

    async def close(self) -> None:
        if not self.rollout.done():
            self.rollout.cancel()
            await asyncio.gather(self.rollout, return_exceptions=True)

    def _observed(self, message: Any) -> dict[str, Any]:
        out = as_dict(message)
        if out["role"] not in ("user", "tool"):  # an env answering as system/assistant: shown to the model as user
            out = {"role": "user", "content": out["content"]}
        return out

    async def _next_request(self) -> tuple[list[Any], Any] | None:
        """verifiers' next model request, or None when its rollout ended; bounded by ``timeout_s``."""
        get = asyncio.ensure_future(self.client.requests.get())
        try:
            done, _ = await asyncio.wait({get, self.rollout}, timeout=self.env.settings.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not get.done():
                get.cancel()
        if get in done:
            return get.result()
        if self.rollout in done:
            return None
        raise EpisodeAborted(f"the verifiers env did not answer within {self.env.settings.timeout_s:g} s")

    async def _bounded(self, awaitable: Any, what: str) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self.env.settings.timeout_s)
        except asyncio.TimeoutError as exc:
            raise EpisodeAborted(f"the verifiers env did not {what} within {self.env.settings.timeout_s:g} s") from exc

    def _rollout_error(self, raise_it: bool = False) -> str:
        """Why the rollout failed ('' if it did not): an exception out of it, or verifiers' ``state["error"]``."""
        if not self.rollout.done():
            return ""
        if self.rollout.cancelled():
            reason = "the verifiers rollout was cancelled"
        elif self.rollout.exception() is not None:
            exc = self.rollout.exception()
            reason = f"the verifiers env raised {type(exc).__name__}: {exc}"
        else:
            error = self.rollout.result().get("error")
            reason = f"the verifiers rollout failed: {type(error).__name__}: {error}" if error is not None else ""
        if reason and raise_it:
            raise EpisodeAborted(reason[:500])
        return reason


class VerifiersEnvironment(Environment):
    tag: ClassVar[str] = TAG
    prepare_data: ClassVar[str | None] = "aclarena_envs.verifiers.data.main"

    def __init__(self, config: Mapping[str, Any] | None = None, vf_env: Any = None) -> None:
        super().__init__(config)
        self.settings = from_mapping(VerifiersConfig, self.config, "config keys of the verifiers env")
        if vf_env is None and not self.settings.env_id:
            raise ValueError("the verifiers env needs env_id: the module whose load_environment() builds the env")
        self.vf_env = vf_env if vf_env is not None else load(self.settings.env_id, self.settings.env_args)
        low, high = (float(x) for x in self.settings.reward_range)
        if not low < high:
            raise ValueError(f"verifiers: reward_range must be [low, high] with low < high, got {self.settings.reward_range}")
        self.reward_range = (low, high)
        own = int(getattr(self.vf_env, "max_turns", -1) or -1)
        self.max_turns = self.settings.max_turns or (own if own > 0 else 10)
        from aclarena_envs.retail.tool_calls import ToolCallParser

        self.parser = ToolCallParser()
        logging.getLogger("verifiers").addHandler(_HANDLER)

    def rollout_input(self, task: Task) -> dict[str, Any]:
        """A record as verifiers' ``RolloutInput``: prompt messages, answer, info, example id."""
        md = task.metadata
        prompt = task.prompt if isinstance(task.prompt, list) else [{"role": "user", "content": str(task.prompt)}]
        out: dict[str, Any] = {"prompt": [dict(m) for m in prompt], "example_id": int(md.get("example_id", md.get("index", 0)) or 0)}
        if task.label is not None:
            out["answer"] = task.label if isinstance(task.label, str) else str(task.label_value)
        if md.get("info"):
            out["info"] = dict(md["info"])
        return out

    async def start(self, task: Task) -> VerifiersEpisode:
        episode = VerifiersEpisode(self, task)
        try:
            await episode.begin()
        except BaseException:
            await episode.close()
            raise
        return episode

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        return records(self.vf_env, n, seed, tag=self.tag)
