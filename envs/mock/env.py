"""A guessing game: the smallest multi-turn environment, for development, docs and tests.

The model guesses the secret word (the record's label) as ``<guess>word</guess>``; a wrong guess gets
a hint as a user message, a right one ends the episode. Reward: 1.0 if guessed within the turn
limit, minus 0.1 per extra guess (floor 0.1); 0.0 if never guessed. Config: ``max_turns`` (default 3).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Observation, Score, Task
from aclarena_slime.plugin.settings import from_mapping

_GUESS = re.compile(r"<guess>(.*?)</guess>", re.S)


@dataclass(frozen=True)
class MockConfig:
    """The env's settings: built strictly, so a misspelt key is an error, not a silent default."""

    max_turns: int = 3


class MockEpisode(Episode):
    def __init__(self, secret: str, prompt: str) -> None:
        self.secret, self.guesses, self.solved = secret, [], False
        self.conversation = Conversation(
            [{"role": "user", "content": prompt or "Guess the secret word. Answer as <guess>word</guess>."}]
        )

    async def step(self, text: str) -> Observation | Done:
        found = _GUESS.findall(text)
        if not found:
            return Observation([{"role": "user", "content": "No guess found. Write <guess>word</guess>."}])
        guess = found[-1].strip().lower()
        self.guesses.append(guess)
        if guess == self.secret.lower():
            self.solved = True
            return Done("guessed")
        hint = f"Wrong. The word has {len(self.secret)} letters and starts with {self.secret[0]!r}."
        return Observation([{"role": "user", "content": hint}])

    async def score(self) -> Score:
        reward = max(0.1, 1.0 - 0.1 * (len(self.guesses) - 1)) if self.solved else 0.0
        return Score(round(reward, 6), {"solved": self.solved, "guesses": list(self.guesses)})


class MockEnvironment(Environment):
    tag: ClassVar[str] = "mock"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.max_turns = int(from_mapping(MockConfig, self.config, "config keys of the mock env").max_turns)

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        words = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "grape"]
        return [{"prompt": "", "label": rng.choice(words), "metadata": {"env": self.tag, "index": i}} for i in range(n)]

    async def start(self, task: Task) -> MockEpisode:
        secret = str(task.label_value if task.label is not None else "")
        if not secret:
            raise ValueError("mock record needs the secret word as its label")
        return MockEpisode(secret, task.prompt if isinstance(task.prompt, str) else "")
