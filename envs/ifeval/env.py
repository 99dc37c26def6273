"""The instruction-following environment (stage 4): one turn, IFEval's verifiable instructions.

Reward range: [0, 1]. By default 1 when every instruction of the prompt is followed, else 0
(IFEval's prompt level); ``level: instruction`` gives the fraction followed instead. ``mode`` picks
strict (the response as written) or loose (IFEval's relaxed reading). The breakdown always carries
all four IFEval numbers and a verdict per instruction, so evaluation needs no second pass. Thinking
(``<think>…</think>``) is removed before checking.

Config (recipe ``aclarena_env_config.ifeval``): ``level`` (``prompt`` | ``instruction``),
``mode`` (``strict`` | ``loose``).

Label: ``{"instruction_id_list": [...], "kwargs": [...]}`` as a dict or JSON text. A label with an
unknown instruction id or bad kwargs raises :class:`~aclarena_envs.ifeval.checkers.LabelError` at
``start``: it is a data error, never a zero reward.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from aclarena_envs.ifeval.generator import generate
from aclarena_envs.ifeval.reward import LEVELS, MODES, Label, judge, strip_thinking
from aclarena_slime.contract import Conversation, Done, Environment, Episode, Score, Task


class IFEvalEpisode(Episode):
    def __init__(self, label: Label, conversation: Conversation, level: str, mode: str) -> None:
        self.label, self.conversation, self.level, self.mode = label, conversation, level, mode
        self.response = ""

    async def step(self, text: str) -> Done:
        self.response = text
        return Done("answered")

    async def score(self) -> Score:
        answer, had_thinking = strip_thinking(self.response)
        verdicts = judge(self.label, answer)
        breakdown = {"level": self.level, "mode": self.mode, "thinking_removed": had_thinking, **verdicts.breakdown()}
        return Score(verdicts.reward(self.level, self.mode), breakdown)


class IFEvalEnvironment(Environment):
    tag: ClassVar[str] = "ifeval"
    prepare_data: ClassVar[str] = "aclarena_envs.ifeval.data.main"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        unknown = sorted(set(self.config) - {"level", "mode"})
        if unknown:
            raise ValueError(f"ifeval: unknown config keys {unknown}; it takes 'level' and 'mode'")
        self.level = str(self.config.get("level", "prompt"))
        self.mode = str(self.config.get("mode", "strict"))
        if self.level not in LEVELS:
            raise ValueError(f"ifeval: level must be one of {list(LEVELS)}, got {self.level!r}")
        if self.mode not in MODES:
            raise ValueError(f"ifeval: mode must be one of {list(MODES)}, got {self.mode!r}")

    @staticmethod
    def conversation(task: Task) -> Conversation:
        if isinstance(task.prompt, list):
            return Conversation([dict(message) for message in task.prompt])
        return Conversation([{"role": "user", "content": str(task.prompt)}])

    async def start(self, task: Task) -> IFEvalEpisode:
        label = Label.parse(task.label_value)
        label.checkers()  # build now: a bad label fails here, naming the instruction
        return IFEvalEpisode(label, self.conversation(task), self.level, self.mode)

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """Generated prompts (see :mod:`aclarena_envs.ifeval.generator`), reproducible from ``seed``."""
        return [prompt.to_slime(i, seed) for i, prompt in enumerate(generate(n, seed))]
