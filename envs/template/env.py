"""Template for a new environment: copy this folder, rename the tag, fill in ``start``, ``step``, ``score``.

Reward range: [0, 1]. A one-turn task: the model answers, the answer (after any thinking) is compared
with the label. Config (recipe ``env_config.template``, ``recipes/env/template.yaml``): ``instruction``,
appended to the prompt. Settings live in a dataclass built with
:func:`~aclarena_slime.plugin.settings.from_mapping`, so a misspelt key fails instead of being ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from aclarena_envs.template import data
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Score, Task
from aclarena_slime.plugin.settings import from_mapping


@dataclass(frozen=True)
class TemplateConfig:
    """The env's settings (recipe ``env_config.template``)."""

    instruction: str = "Answer with the word only."


class TemplateEpisode(Episode):
    """One conversation: the state ``score`` needs (here, the answer)."""

    def __init__(self, task: Task, instruction: str) -> None:
        self.task, self.answer = task, ""
        self.conversation = Conversation([{"role": "user", "content": f"{task.prompt}\n\n{instruction}"}])

    async def step(self, text: str) -> Done:
        self.answer = text.split("</think>")[-1].strip()
        return Done("answered")

    async def score(self) -> Score:
        correct = self.answer.lower() == str(self.task.label_value).lower()
        return Score(1.0 if correct else 0.0, {"answer": self.answer[:200], "correct": correct})


class TemplateEnvironment(Environment):
    tag: ClassVar[str] = data.TAG
    prepare_data: ClassVar[str | None] = "aclarena_envs.template.data.main"  # `aclarena data prepare template`

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.instruction = from_mapping(TemplateConfig, self.config, "config keys of the template env").instruction

    async def start(self, task: Task) -> TemplateEpisode:
        return TemplateEpisode(task, self.instruction)

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        return data.demo_records(n, seed, self.tag)
