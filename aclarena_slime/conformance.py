"""A conformance kit any environment plugin can run on itself (``check_env`` in Gymnasium's spirit).

In a plugin's tests::

    from aclarena_slime.conformance import check_environment

    async def test_conforms():
        await check_environment(MyEnvironment({}), [Task(prompt="...", label="...", metadata={"env": "mine"})])

It raises :class:`ConformanceError` listing every broken invariant of :mod:`aclarena_slime.contract`,
including robustness: hostile model turns (empty, huge, binary junk, unclosed tags, fake tool calls)
must come back as an observation or ``Done``, never as an exception.
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Sequence

from aclarena_slime.contract import CONTRACT_VERSION, Conversation, Done, Environment, Episode, Observation, Task

HOSTILE_TURNS = [
    "",
    "   \n\t ",
    "\x00\x01\x02 binary junk \udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    "<think> never closed",
    "<tool_call>{not json</tool_call>",
    '<tool_call>{"name": "no_such_tool", "arguments": {"x": 1}}</tool_call>',
    "<search></search>",
    "<answer></answer>",
    "\\boxed{",
    "x" * 20_000,
    "日本語のテキスト 🚀",
]


class ConformanceError(AssertionError):
    pass


def _check_messages(messages: object, where: str, problems: list[str]) -> None:
    if not isinstance(messages, list) or not messages:
        problems.append(f"{where}: messages must be a non-empty list")
        return
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content", ""), str):
            problems.append(f"{where}: each message needs a 'role' and string 'content', got {m!r:.200}")
    try:
        json.dumps(messages)
    except (TypeError, ValueError) as exc:
        problems.append(f"{where}: messages are not JSON-serialisable ({exc})")


def _role(message: object) -> object:
    """A message's role; None for a message that is not a dict (reported by :func:`_check_messages`)."""
    return message.get("role") if isinstance(message, dict) else None


async def _score_ok(env: Environment, episode: Episode, where: str, problems: list[str]) -> None:
    try:
        score = await episode.score()
    except Exception as exc:  # noqa: BLE001
        problems.append(f"{where}: score() raised {type(exc).__name__}: {exc}")
        return
    low, high = env.reward_range
    if not isinstance(score.reward, (int, float)) or math.isnan(score.reward) or not low <= score.reward <= high:
        problems.append(f"{where}: reward {score.reward!r} outside reward_range {env.reward_range}")
    try:
        json.dumps(score.breakdown)
    except (TypeError, ValueError) as exc:
        problems.append(f"{where}: score breakdown is not JSON-serialisable ({exc})")


async def check_environment(env: Environment, tasks: Sequence[Task], turns: Sequence[str] = ()) -> None:
    """Run every invariant on ``tasks``; ``turns`` are extra model turns the plugin wants tried."""
    problems: list[str] = []
    if not isinstance(getattr(type(env), "tag", None), str) or not type(env).tag:
        problems.append("Environment.tag must be a non-empty string")
    if type(env).version != CONTRACT_VERSION:
        problems.append(f"Environment.version is {type(env).version}, this contract is version {CONTRACT_VERSION}")
    if env.max_turns < 1:
        problems.append("max_turns must be at least 1")
    if not tasks:
        problems.append("check_environment needs at least one task")
    for i, task in enumerate(tasks):
        where = f"task {i}"
        try:
            pickle.loads(pickle.dumps(task))
        except Exception as exc:  # noqa: BLE001 - Ray ships tasks between processes
            problems.append(f"{where}: Task does not round-trip through pickle ({exc})")
        for turn in [*HOSTILE_TURNS, *turns]:
            label = f"{where}, turn {turn[:30]!r}"
            try:
                episode = await env.start(task)
            except Exception as exc:  # noqa: BLE001 - reported, like every other broken invariant
                problems.append(f"{where}: start() raised {type(exc).__name__}: {exc}")
                break
            try:
                conversation = episode.conversation
                if not isinstance(conversation, Conversation):
                    problems.append(f"{where}: episode.conversation is {type(conversation).__name__}, not Conversation")
                    break
                _check_messages(conversation.messages, f"{where} conversation", problems)
                messages = conversation.messages
                if messages and _role(messages[-1] if isinstance(messages, list) else None) not in ("user", "tool"):
                    problems.append(f"{where}: the conversation must end with a user or tool message")
                if conversation.tools is not None:
                    try:
                        json.dumps(conversation.tools)
                    except (TypeError, ValueError) as exc:
                        problems.append(f"{where}: tools are not JSON-serialisable ({exc})")
                try:
                    result = await episode.step(turn)
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"{label}: step() raised {type(exc).__name__}: {exc}")
                    continue
                if isinstance(result, Observation):
                    _check_messages(result.messages, f"{label} observation", problems)
                    roles = {_role(m) for m in result.messages} if isinstance(result.messages, list) else set()
                    bad_roles = roles - {"user", "tool"}
                    if bad_roles:
                        problems.append(
                            f"{label}: observation roles must be user/tool, got {sorted(map(str, bad_roles))}"
                        )
                elif not isinstance(result, Done):
                    problems.append(f"{label}: step() returned {type(result).__name__}, not Observation or Done")
                await _score_ok(env, episode, label, problems)
            finally:
                await episode.close()
    if problems:
        raise ConformanceError(
            f"{type(env).__name__} breaks the env contract:\n- " + "\n- ".join(dict.fromkeys(problems))
        )
