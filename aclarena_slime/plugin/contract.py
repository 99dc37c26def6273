"""The environment plugin contract, version 1.

An environment plugin never sees tokens, slime or SGLang: it deals in chat messages and text. The
generic agent loop (:mod:`aclarena_slime.agent_loop`) turns that into token-in/token-out rollouts.

Two objects, because heavy resources and per-conversation state have different lifetimes:

- :class:`Environment` is built once per process from its configuration (a retriever index, a
  database, a verifier pool live here) and registered under a tag through the entry-point group
  ``aclarena_slime.envs``.
- :class:`Episode` is one conversation, made by :meth:`Environment.start` for one dataset record.

Worked example (a one-turn env that rewards saying the label)::

    class EchoEpisode(Episode):
        def __init__(self, task):
            self.task, self.said = task, ""
            self.conversation = Conversation([{"role": "user", "content": f"Say {task.label}."}])

        async def step(self, text):
            self.said = text
            return Done("answered")

        async def score(self):
            ok = self.task.label in self.said
            return Score(float(ok), {"said_label": ok})

    class EchoEnvironment(Environment):
        tag = "echo"

        async def start(self, task):
            return EchoEpisode(task)

Invariants the conformance kit (:mod:`aclarena_slime.plugin.conformance`) checks:

- ``start`` returns an episode whose ``conversation`` ends with a user (or tool) message;
- ``step`` returns :class:`Observation` (one or more messages, role user or tool) or :class:`Done`;
  it never raises for anything the model wrote — bad model output is an observation or a low score;
- ``score`` is within ``reward_range`` and its breakdown is JSON-serialisable;
- the loop calls ``step`` at most ``max_turns`` times; after that it scores what it has.

Optional: ``demo_records`` (generated data for smoke runs and the local backend) and
``routing_prompts`` (prompts the router's tag classifier learns the env from; by default the demo
records' prompts).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

CONTRACT_VERSION = 1

Message = dict[str, Any]


@dataclass(frozen=True)
class Task:
    """One dataset record as the env sees it (slime JSONL: ``prompt``, ``label``, ``metadata``)."""

    prompt: str | list[Message]
    label: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label_value(self) -> Any:
        """The label decoded from JSON when slime hands it over as a string."""
        if isinstance(self.label, str):
            try:
                return json.loads(self.label)
            except json.JSONDecodeError:
                return self.label
        return self.label


@dataclass
class Conversation:
    """The initial conversation: chat messages and, for tool-using envs, OpenAI-style tool schemas."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None


@dataclass
class Observation:
    """What the env answers to a model turn: messages appended to the conversation, never trained on."""

    messages: list[Message]


@dataclass
class Done:
    """The episode is over; ``reason`` is recorded in the sample's metadata."""

    reason: str = "done"


@dataclass
class Score:
    """The episode's reward plus a JSON-serialisable breakdown (what was checked and how it went)."""

    reward: float
    breakdown: dict[str, Any] = field(default_factory=dict)


class EpisodeAborted(Exception):
    """An outside service the env depends on failed (user simulator, retriever server).

    The loop marks the sample ABORTED instead of scoring it: a failed service must never be
    turned into a reward of 0 that trains the policy.
    """


class Episode(ABC):
    """One conversation. Holds whatever state ``score`` needs."""

    conversation: Conversation

    @abstractmethod
    async def step(self, text: str) -> Observation | Done:
        """Take the model's turn as text (thinking included, special tokens removed)."""

    @abstractmethod
    async def score(self) -> Score:
        """Score the episode so far. Called once, after the last turn (or the turn limit)."""

    async def close(self) -> None:  # noqa: B027 - optional hook, most episodes hold nothing
        """Release per-episode resources."""


class Environment(ABC):
    """A registered environment: configuration and shared resources, a factory of episodes."""

    tag: ClassVar[str]
    version: ClassVar[int] = CONTRACT_VERSION
    reward_range: ClassVar[tuple[float, float]] = (0.0, 1.0)

    #: Most model turns per episode (1 for single-turn envs).
    max_turns: int = 1
    #: Extra stop strings for the engine, e.g. ``"</search>"``: a turn ends where the env must act.
    stop: tuple[str, ...] = ()
    #: Dotted path ``module.function`` of the env's data preparation, ``main(argv: list[str]) -> int``;
    #: ``aclarena data prepare TAG ARGS...`` calls it with ``ARGS``.
    prepare_data: ClassVar[str | None] = None

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        self.config: dict[str, Any] = dict(config or {})

    @abstractmethod
    async def start(self, task: Task) -> Episode:
        """Begin an episode for one dataset record."""

    def check_label(self, label: Any) -> None:  # noqa: B027 - optional hook: most labels need no check
        """Raise ``ValueError`` saying what is wrong when ``label`` (a record's, decoded as :attr:`Task.label_value`)
        could not score an episode. Called on every record where data is loaded (an evaluation's datasets, the
        doctor's scan of the training data), so a bad label fails there naming its ``file:line``, not when its
        record is drawn mid-run. Keep it cheap and offline: no services."""

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` generated slime JSONL records (``prompt``, ``label``, ``metadata.env``) for smoke runs.

        The local backend and the docs use these when no dataset is named; data needs no download.
        """
        raise NotImplementedError(f"environment {self.tag!r} generates no demo records; name a dataset instead")

    @classmethod
    def routing_prompts(cls, n: int, seed: int = 0) -> list[str]:
        """``n`` prompt texts in the style of this env's requests, to train the router's tag classifier.

        A class method: the router knows the installed envs, not their configuration. The default builds
        the env with its default configuration and takes the prompts of :meth:`demo_records`; override it
        when that needs configuration, or to add the phrasings real clients use. The same ``seed`` gives
        the same prompts (a held-out set asks with another seed).
        """
        try:
            records = cls().demo_records(n, seed)
        except (NotImplementedError, ValueError) as exc:
            raise NotImplementedError(
                f"environment {cls.tag!r} has no routing prompts ({exc}); override Environment.routing_prompts"
            ) from exc
        return [prompt_text(record.get("prompt")) for record in records]

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release shared resources (worker pools, files)."""


def prompt_text(prompt: str | list[Message] | None) -> str:
    """The words of a record's prompt: the string itself, or the contents of its chat messages."""
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, Mapping))
    return str(prompt or "")
