"""``learnable``: answer with one word made only of the characters the label allows (digits by default).

The turn ends at the first space or newline (the env's stop strings), so even a random model, which
almost never writes its end-of-turn token, hands in an answer. Reward in [0, 1]: the share of the
answer's non-space characters that are in the label's set (an empty answer scores 0). The reward is
dense, so a random tiny model already gets signal from a GRPO group, and raising it needs the
advantages, loss mask and log-probs to be right end to end. Config: none. Not a benchmark; it exists
to show that the local backend learns.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from aclarena_slime.contract import Conversation, Done, Environment, Episode, Score, Task

DIGITS = "0123456789"
_PROMPTS = ("Reply with one number.", "Answer with digits only.", "Write a number.", "One number, please.")


class LearnableEpisode(Episode):
    def __init__(self, prompt: str, allowed: str) -> None:
        self.allowed, self.response = set(allowed), ""
        self.conversation = Conversation([{"role": "user", "content": prompt}])

    async def step(self, text: str) -> Done:
        self.response = text
        return Done("answered")

    async def score(self) -> Score:
        chars = [c for c in self.response if not c.isspace()]
        hits = sum(c in self.allowed for c in chars)
        return Score(hits / len(chars) if chars else 0.0, {"chars": len(chars), "allowed": hits})


class LearnableEnvironment(Environment):
    tag: ClassVar[str] = "learnable"
    stop = (" ", "\n")

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
        return LearnableEpisode(prompt, allowed)
