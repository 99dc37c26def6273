"""``learnable``: answer with one word made only of the characters the label allows (digits by default).

The turn ends at the first space or newline (the env's stop strings), so even a random model, which
almost never writes its end-of-turn token, hands in an answer. Reward in [0, 1]: the share of the
answer's non-space characters that are in the label's set (an empty answer scores 0). The reward is
dense, so a random tiny model already gets signal from a GRPO group, and raising it needs the
advantages, loss mask and log-probs to be right end to end. Not a benchmark; it exists to show
that the local backend learns.

Config: ``turns`` (default 1): answers per episode; after each but the last the user asks for another
(an observation, never trained on), and the reward is the mean over the answers. Several turns
exercise the multi-turn token plumbing with the same learnable reward.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Observation, Score, Task

DIGITS = "0123456789"
_PROMPTS = ("Reply with one number.", "Answer with digits only.", "Write a number.", "One number, please.")


class LearnableEpisode(Episode):
    def __init__(self, prompt: str, allowed: str, turns: int) -> None:
        self.allowed, self.turns, self.answers = set(allowed), turns, []
        self.conversation = Conversation([{"role": "user", "content": prompt}])

    async def step(self, text: str) -> Observation | Done:
        self.answers.append(text)
        if len(self.answers) < self.turns:
            return Observation([{"role": "user", "content": "Another one."}])
        return Done("answered")

    async def score(self) -> Score:
        shares = [self._share(a) for a in self.answers]
        reward = sum(shares) / self.turns  # a missing answer (turn or token limit) counts 0
        return Score(reward, {"answers": len(self.answers), "shares": shares})

    def _share(self, answer: str) -> float:
        chars = [c for c in answer if not c.isspace()]
        return sum(c in self.allowed for c in chars) / len(chars) if chars else 0.0


class LearnableEnvironment(Environment):
    tag: ClassVar[str] = "learnable"
    stop = (" ", "\n")

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.max_turns = int(self.config.get("turns", 1))
        if self.max_turns < 1:
            raise ValueError(f"learnable: turns must be >= 1, got {self.max_turns}")

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        return [
            {"prompt": rng.choice(_PROMPTS), "label": DIGITS, "metadata": {"env": self.tag, "index": i}}
            for i in range(n)
        ]

    async def start(self, task: Task) -> LearnableEpisode:
        allowed = str(task.label) if task.label is not None else DIGITS  # raw: "0123..." is no number
        if not allowed:
            raise ValueError("a learnable record's label must name the allowed characters")
        prompt = task.prompt if isinstance(task.prompt, str) and task.prompt else _PROMPTS[0]
        return LearnableEpisode(prompt, allowed, self.max_turns)
