"""Gold demo trajectories as SFT examples: scripted model turns replayed through the real agent loop.

An env plugin that can write a correct answer for its own demo records offers a *demo-turns function*,
``turns(record) -> list[str]`` (the model's turns of a gold trajectory, as text), named by a dotted
path in the local profile (``warm_start_demos``); the library never names the env. Each record's turns
are replayed through :func:`aclarena_slime.agent_loop.run_episode`, the loop every rollout takes, with
a :class:`ScriptedClient` in the place of the engine: the prompt, the observations (a search result, a
user's reply) and the loss mask come out exactly as in a rollout, and the env scores the trajectory
with its own reward. Trajectories below ``min_reward`` are dropped (the authors filter teacher rollouts
by reward the same way), so a demo function with a bug cannot teach wrong answers.

Records with turns from elsewhere (a teacher's rollout dump: ``metadata.aclarena.turns``) replay the
same way through :func:`replay_examples`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aclarena_slime.agent_loop import COMPLETED, run_episode
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.dotted import DottedPathError, load_dotted
from aclarena_slime.local.sft import SftExample
from aclarena_slime.plugin.contract import Environment, Task
from aclarena_slime.rollout import Budgets, loop_settings

DemoTurns = Callable[[dict[str, Any]], list[str]]


class DemoError(ValueError):
    """A demo-turns function that cannot be loaded, or demos that cannot train; the message says which."""


def load_demo_turns(path: str) -> DemoTurns:
    """The function at ``package.module.function`` (or ``package.module:function``)."""
    try:
        fn = load_dotted(path)
    except DottedPathError as exc:
        raise DemoError(f"warm_start_demos: {exc}") from exc
    except (ImportError, AttributeError) as exc:
        raise DemoError(f"cannot load the demo-turns function {path!r}: {exc}") from exc
    if not callable(fn):
        raise DemoError(f"{path!r} is not a function")
    return fn


class ScriptedClient:
    """Answers each ``generate`` call with the next scripted turn, in SGLang's response shape.

    A turn that ends with one of the request's stop strings ends there (the engine stops on it);
    any other turn ends with the end-of-turn token, as a model closes its turn. A turn longer than
    the request's ``max_new_tokens`` is cut, with finish reason ``length``, as the engine would.
    """

    def __init__(self, chat: ChatTokens, turns: Sequence[str], end_of_turn: int) -> None:
        self.chat, self.turns, self.end_of_turn, self.calls = chat, list(turns), end_of_turn, 0

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], **_: Any) -> dict[str, Any]:
        if self.calls >= len(self.turns):  # the env wants another turn the script lacks: an empty close
            text = ""
        else:
            text = self.turns[self.calls]
        self.calls += 1
        ids = self.chat.encode(text)
        stops = [s for s in sampling_params.get("stop") or [] if s]
        matched = next((s for s in stops if text.endswith(s)), None)
        if matched is None:
            ids.append(self.end_of_turn)
        finish: dict[str, Any] = {"type": "stop", "matched": matched if matched is not None else self.end_of_turn}
        budget = int(sampling_params.get("max_new_tokens") or len(ids))
        if len(ids) > budget:
            ids, finish = ids[:budget], {"type": "length", "length": budget}
        return {
            "text": text,
            "output_ids": ids,
            "meta_info": {"finish_reason": finish, "output_token_logprobs": [[0.0, t, None] for t in ids]},
        }


@dataclass(frozen=True)
class ReplayReport:
    """How many demos were replayed, kept, and why the others were dropped."""

    replayed: int
    kept: int
    below_reward: int
    not_completed: int
    mean_reward: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


async def replay_examples(
    env: Environment,
    chat: ChatTokens,
    demos: Sequence[tuple[dict[str, Any], Sequence[str]]],
    budgets: Budgets,
    min_reward: float,
    end_of_turn: int,
) -> tuple[list[SftExample], ReplayReport]:
    """SFT examples from ``(record, turns)`` pairs: each replayed, scored by the env, kept if good enough."""

    async def one(record: dict[str, Any], turns: Sequence[str]) -> Any:
        task = Task(prompt=record["prompt"], label=record.get("label"), metadata=dict(record.get("metadata") or {}))
        client = ScriptedClient(chat, turns, end_of_turn)
        return await run_episode(env, task, client, chat, {}, loop_settings(budgets, {}))

    trajectories = await asyncio.gather(*(one(record, turns) for record, turns in demos))
    examples: list[SftExample] = []
    below = not_completed = 0
    rewards = []
    for traj in trajectories:
        if traj.status != COMPLETED or traj.score is None:
            not_completed += 1
            continue
        rewards.append(traj.score.reward)
        if traj.score.reward < min_reward or not any(traj.loss_mask):
            below += 1
            continue
        examples.append(SftExample(tokens=traj.tokens, loss_mask=[0] * len(traj.prompt_ids) + traj.loss_mask))
    report = ReplayReport(
        replayed=len(demos),
        kept=len(examples),
        below_reward=below,
        not_completed=not_completed,
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
    )
    return examples, report


async def demo_examples(
    env: Environment,
    chat: ChatTokens,
    records: Sequence[dict[str, Any]],
    turns_of: DemoTurns,
    budgets: Budgets,
    min_reward: float,
) -> tuple[list[SftExample], ReplayReport]:
    """SFT examples from the env's gold demo trajectories for ``records`` (see the module docstring); each demo
    turn closes with :func:`end_of_turn` of the chat's tokenizer."""
    demos = [(record, list(turns_of(record))) for record in records]
    return await replay_examples(env, chat, demos, budgets, min_reward, end_of_turn(chat.tokenizer))


def end_of_turn(tokenizer: Any) -> int:
    """The token that closes a model turn: the chat template's end-of-turn (``<|im_end|>``), else the
    tokenizer's eos (the lowest id when it lists several): the one rule every gold-demo replay uses."""
    if "<|im_end|>" in tokenizer.get_vocab():
        return int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    eos = tokenizer.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if not ids:
        raise DemoError("the tokenizer has neither <|im_end|> nor an eos token: no token closes a demo turn")
    return int(min(ids))
