"""A conformance kit any environment plugin can run on itself (``check_env`` in Gymnasium's spirit).

In a plugin's tests::

    from aclarena_slime.plugin.conformance import check_environment

    async def test_conforms():
        await check_environment(MyEnvironment({}), [Task(prompt="...", label="...", metadata={"env": "mine"})])

It raises :class:`ConformanceError` listing every broken invariant of :mod:`aclarena_slime.plugin.contract`
(``check_label`` must accept the tasks' own labels),
that the env's tag resolves to its class through the installed entry points (a line added to
``pyproject.toml`` without reinstalling is caught here, with the fix), and robustness: hostile model turns (empty, huge, binary junk, unclosed tags, fake tool calls)
must come back as an observation or ``Done``, never as an exception.

:func:`check_hostile_outputs` goes further, the same way (``await check_hostile_outputs(env, tasks)``):
the known-bad corpus of :mod:`aclarena_slime.plugin.hostile` plus property-based turns from ``hypothesis``,
each through ``start``/``step``/``score`` under a hard deadline per call, so a hang fails the check
instead of stalling the suite.
"""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from aclarena_slime.plugin import hostile, registry
from aclarena_slime.plugin.contract import CONTRACT_VERSION, Conversation, Done, Environment, Episode, Observation, Task

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


def entry_point_problems(env_class: type[Environment]) -> list[str]:
    """Why ``env_class``'s tag does not resolve to it through the installed entry points (empty: it does).

    Entry points are read from the installed packages' metadata, not from ``pyproject.toml``: a line
    added there counts only once the package is reinstalled, which is what these messages say.
    """
    tag = getattr(env_class, "tag", None)
    target = f"{env_class.__module__}:{env_class.__qualname__}"
    reinstall = "then reinstall your package (pip install -e .): entry points are read from the installed metadata"
    found = registry.entry_point(tag) if isinstance(tag, str) else None
    if found is None:
        return [
            f"tag {tag!r} is not registered in the entry-point group {registry.ENTRY_POINT_GROUP!r} of the installed "
            f'packages: add `{tag} = "{target}"` under [project.entry-points."{registry.ENTRY_POINT_GROUP}"] in '
            f"your pyproject.toml, {reinstall}{_shadowed(env_class.__module__)}"
        ]
    try:
        loaded = found.load()
    except Exception as exc:  # noqa: BLE001 - the plugin's own import error, reported
        return [f"tag {tag!r}: its entry point {found.value!r} fails to load ({exc!r})"]
    if loaded is not env_class:
        return [
            f"tag {tag!r} resolves through its installed entry point to {found.value!r}, not {target!r}: "
            f"fix the line in your pyproject.toml, {reinstall}"
        ]
    return []


def _shadowed(module: str) -> str:
    """A hint when an older copy of the metadata of ``module``'s distribution hides the installed one.

    Python reads the entry points of the first copy on ``sys.path``: a stale ``<name>.egg-info`` in the
    folder tests run from wins over what a reinstall wrote into site-packages.
    """
    from importlib.metadata import distributions, packages_distributions

    hints = []
    for name in packages_distributions().get(module.split(".")[0], []):
        copies = [str(getattr(dist, "_path", "?")) for dist in distributions(name=name)]
        if len(copies) > 1:
            hints.append(
                f"; several copies of {name}'s metadata are visible and the first wins: {', '.join(copies)} "
                "(delete the stale one, e.g. an old .egg-info folder in your source tree)"
            )
    return "".join(hints)


async def check_environment(
    env: Environment, tasks: Sequence[Task], turns: Sequence[str] = (), *, entry_point: bool = True
) -> None:
    """Run every invariant on ``tasks``; ``turns`` are extra model turns the plugin wants tried.

    With ``entry_point`` (the default) the env's tag must also resolve to its class through the
    installed entry points; ``entry_point=False`` is for envs defined inside a test.
    """
    problems: list[str] = entry_point_problems(type(env)) if entry_point else []
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
        try:
            env.check_label(task.label_value)
        except Exception as exc:  # noqa: BLE001 - a plugin's check_label must accept its own gold labels
            problems.append(f"{where}: check_label refused its label {task.label!r:.100} ({type(exc).__name__}: {exc})")
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


@dataclass
class _Watch:
    """What the worker thread is doing now, for the deadline watcher; and what it found."""

    call: str = ""
    started: float | None = None
    problems: list[str] = field(default_factory=list)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


async def _one_turn(env: Environment, task: Task, turn: str, watch: _Watch) -> None:
    """start, step, score and close one episode on ``turn``; every broken rule goes to ``watch.problems``."""
    label = f"turn {turn[:40]!r} ({len(turn)} chars)"

    async def timed(what: str, awaitable):
        watch.call, watch.started = f"{what} on {label}", time.monotonic()
        try:
            return await awaitable
        finally:
            watch.started = None

    try:
        episode = await timed("start()", env.start(task))
    except Exception as exc:  # noqa: BLE001
        watch.problems.append(f"start() raised {type(exc).__name__}: {exc}"[:500])
        return
    try:
        try:
            result = await timed("step()", episode.step(turn))
        except Exception as exc:  # noqa: BLE001
            watch.problems.append(f"{label}: step() raised {type(exc).__name__}: {exc}"[:500])
            return
        if isinstance(result, Observation):
            for message in result.messages if isinstance(result.messages, list) else []:
                content = message.get("content") if isinstance(message, dict) else None
                try:
                    json.dumps(message, ensure_ascii=False).encode("utf-8")
                except (TypeError, ValueError):
                    watch.problems.append(f"{label}: an observation is not JSON-serialisable valid Unicode")
                if isinstance(content, str) and len(content) > 10 * len(turn) + 100_000:
                    watch.problems.append(f"{label}: an observation of {len(content)} chars (unbounded echo?)")
        elif not isinstance(result, Done):
            watch.problems.append(f"{label}: step() returned {type(result).__name__}")
        try:
            score = await timed("score()", episode.score())
        except Exception as exc:  # noqa: BLE001
            watch.problems.append(f"{label}: score() raised {type(exc).__name__}: {exc}"[:500])
            return
        low, high = env.reward_range
        reward = score.reward
        if not isinstance(reward, (int, float)) or math.isnan(reward) or not low <= reward <= high:
            watch.problems.append(f"{label}: reward {reward!r} outside reward_range {env.reward_range}")
        try:
            json.dumps(score.breakdown, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError):
            watch.problems.append(f"{label}: the score breakdown is not JSON-serialisable valid Unicode")
    finally:
        await timed("close()", episode.close())


def _work(env: Environment, tasks: Sequence[Task], turns: list[str], examples: int, size: int, watch: _Watch) -> None:
    """The worker thread: its own event loop, the corpus, then ``examples`` property-based turns."""
    loop = asyncio.new_event_loop()
    try:
        for task in tasks:
            for turn in turns:
                loop.run_until_complete(_one_turn(env, task, turn, watch))
        if examples:
            from hypothesis import HealthCheck, given, settings  # a dev dependency of the kit's users

            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
            )
            @given(hostile.hypothesis_turns(size))
            def property_check(turn: str) -> None:
                before = len(watch.problems)
                loop.run_until_complete(_one_turn(env, tasks[0], turn, watch))
                assert len(watch.problems) == before, watch.problems[before:]

            try:
                property_check()
            except AssertionError:
                pass  # hypothesis shrank it; the problems are in watch.problems
    except BaseException as exc:  # noqa: BLE001 - reported to the caller's thread
        watch.error = exc
    finally:
        loop.close()
        watch.done.set()


async def check_hostile_outputs(
    env: Environment,
    tasks: Sequence[Task],
    turns: Sequence[str] = (),
    *,
    examples: int = 30,
    size: int = 100_000,
    call_deadline_s: float = 60.0,
) -> None:
    """Hostile model turns through ``start``/``step``/``score``: nothing escapes, rewards stay in range,
    observations and breakdowns are valid Unicode, and no call runs past ``call_deadline_s``.

    The known-bad corpus (``size`` characters per repeated turn) and ``turns`` run on every task, then
    ``examples`` turns from a ``hypothesis`` strategy on the first. The calls run on a worker thread with
    its own event loop, watched from here: a call past its deadline fails the check (naming the call
    and its input) and is left running on its daemon thread, instead of stalling the suite.
    """
    if not tasks:
        raise ConformanceError("check_hostile_outputs needs at least one task")
    watch = _Watch()
    all_turns = [*hostile.corpus(size), *turns]
    worker = threading.Thread(
        target=_work, args=(env, list(tasks), all_turns, examples, size, watch), daemon=True, name="hostile-check"
    )
    worker.start()
    while not watch.done.is_set():
        await asyncio.sleep(0.05)
        started = watch.started
        if started is not None and time.monotonic() - started > call_deadline_s:
            raise ConformanceError(f"{type(env).__name__}: {watch.call} ran past {call_deadline_s} s")
    if watch.error is not None:
        raise ConformanceError(f"{type(env).__name__}: the hostile check failed: {watch.error!r}") from watch.error
    if watch.problems:
        raise ConformanceError(
            f"{type(env).__name__} breaks the env contract on hostile turns:\n- "
            + "\n- ".join(dict.fromkeys(watch.problems))
        )
