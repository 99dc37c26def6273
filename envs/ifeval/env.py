"""The instruction-following environment (stage 4): one turn, IFEval's verifiable instructions.

Reward range: [0, 1]. By default 1 when every instruction of the prompt is followed, else 0
(IFEval's prompt level); ``level: instruction`` gives the fraction followed instead. ``mode`` picks
strict (the response as written) or loose (IFEval's relaxed reading). The breakdown always carries
all four IFEval numbers and a verdict per instruction, so evaluation needs no second pass. Thinking
(``<think>…</think>``) is removed before checking unless ``thinking: keep``, the authors' rule: their
``rm_type ifbench`` hands the raw response to the strict checker (WillDreamer/ACLArena
``slime/slime/rollout/rm_hub/ifbench.py`` lines 168-170), so a comma in the thinking breaks
``punctuation:no_comma``.

Config (recipe ``aclarena_env_config.ifeval``): ``level`` (``prompt`` | ``instruction``),
``mode`` (``strict`` | ``loose``), ``thinking`` (``strip`` | ``keep``), ``max_response_chars`` (20000: a longer answer follows no
instruction, reward 0, ``too_long`` in the breakdown; it counts the checked text, thinking included with ``thinking:
keep``; null: no cap, the authors' rule, ifbench.py:168-170 checks the response whatever its length),
``score_timeout_s`` (60).

Scoring runs in one worker thread per environment, off the event loop: sentence splitting (Punkt) costs
up to ~40 µs per character on degenerate text, so the answer length is capped and the verdict awaited
for at most ``score_timeout_s`` (a late one scores 0, ``timed_out`` in the breakdown).

Label: ``{"instruction_id_list": [...], "kwargs": [...]}`` as a dict or JSON text. A label with an
unknown instruction id or bad kwargs raises :class:`~aclarena_envs.ifeval.checkers.LabelError` at
``start``: it is a data error, never a zero reward.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar

from aclarena_envs.ifeval import routing
from aclarena_envs.ifeval.generator import generate
from aclarena_envs.ifeval.reward import LEVELS, MODES, Label, Verdicts, judge, strip_thinking
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Score, Task
from aclarena_slime.plugin.settings import from_mapping

THINKING = ("strip", "keep")  # keep: check the raw response, thinking included (the authors')


@dataclass(frozen=True)
class IFEvalConfig:
    level: str = "prompt"
    mode: str = "strict"
    thinking: str = "strip"
    max_response_chars: int | None = 20_000  # None: no cap (the authors')
    score_timeout_s: float = 60.0

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> IFEvalConfig:
        """Raises ValueError naming the key for unknown keys and bad values."""
        cfg = from_mapping(cls, config, "config keys of the ifeval env")
        if cfg.level not in LEVELS:
            raise ValueError(f"ifeval: level must be one of {list(LEVELS)}, got {cfg.level!r}")
        if cfg.mode not in MODES:
            raise ValueError(f"ifeval: mode must be one of {list(MODES)}, got {cfg.mode!r}")
        if cfg.thinking not in THINKING:
            raise ValueError(f"ifeval: thinking must be one of {list(THINKING)}, got {cfg.thinking!r}")
        chars, timeout = cfg.max_response_chars, cfg.score_timeout_s
        if chars is not None and (isinstance(chars, bool) or not isinstance(chars, int) or chars < 1):
            raise ValueError(f"ifeval: max_response_chars must be a positive integer or null, got {chars!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"ifeval: score_timeout_s must be a positive number, got {timeout!r}")
        return cfg


class IFEvalEpisode(Episode):
    def __init__(self, env: IFEvalEnvironment, label: Label, conversation: Conversation) -> None:
        self.env, self.label, self.conversation = env, label, conversation
        self.level, self.mode = env.level, env.mode
        self.response = ""

    async def step(self, text: str) -> Done:
        self.response = text
        return Done("answered")

    async def score(self) -> Score:
        cfg = self.env.cfg
        answer, had_thinking = strip_thinking(self.response) if cfg.thinking == "strip" else (self.response, False)
        base = {"level": self.level, "mode": self.mode, "thinking_removed": had_thinking}
        if cfg.max_response_chars is not None and len(answer) > cfg.max_response_chars:
            return Score(0.0, {**base, "too_long": len(answer), **_nothing_followed(self.label)})
        job = asyncio.get_running_loop().run_in_executor(self.env.scorer, judge, self.label, answer)
        try:
            verdicts = await asyncio.wait_for(job, cfg.score_timeout_s)
        except asyncio.TimeoutError:
            return Score(0.0, {**base, "timed_out": cfg.score_timeout_s, **_nothing_followed(self.label)})
        return Score(verdicts.reward(self.level, self.mode), {**base, **verdicts.breakdown()})


def _nothing_followed(label: Label) -> dict[str, Any]:
    """The breakdown of a response that follows no instruction (unscored: too long or too slow)."""
    none = (False,) * len(label.instruction_ids)
    return Verdicts(label.instruction_ids, none, none).breakdown()


class IFEvalEnvironment(Environment):
    tag: ClassVar[str] = "ifeval"
    prepare_data: ClassVar[str] = "aclarena_envs.ifeval.data.main"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.cfg = IFEvalConfig.from_mapping(self.config)
        self.level, self.mode = self.cfg.level, self.cfg.mode
        self._scorer: ThreadPoolExecutor | None = None

    @property
    def scorer(self) -> ThreadPoolExecutor:
        """One thread, made on first use: the checkers' libraries (Punkt, langdetect) are not meant to be raced."""
        if self._scorer is None:
            self._scorer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ifeval-score")
        return self._scorer

    @staticmethod
    def conversation(task: Task) -> Conversation:
        if isinstance(task.prompt, list):
            return Conversation([dict(message) for message in task.prompt])
        return Conversation([{"role": "user", "content": str(task.prompt)}])

    async def start(self, task: Task) -> IFEvalEpisode:
        label = Label.parse(task.label_value)
        label.checkers()  # build now: a bad label fails here, naming the instruction
        return IFEvalEpisode(self, label, self.conversation(task))

    def check_label(self, label: Any) -> None:
        """The label parses and every instruction's checker builds (``LabelError``, a ``ValueError``, says which)."""
        Label.parse(label).checkers()

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """Generated prompts (see :mod:`aclarena_envs.ifeval.generator`), reproducible from ``seed``."""
        return [prompt.to_slime(i, seed, self.tag) for i, prompt in enumerate(generate(n, seed))]

    @classmethod
    def routing_prompts(cls, n: int, seed: int = 0) -> list[str]:
        """Half the demo records' prompts, half IFEval's short constraint phrasings (:mod:`aclarena_envs.ifeval.routing`)."""
        demo = super().routing_prompts(n // 2, seed)
        return demo + routing.prompts(n - len(demo), seed)

    async def aclose(self) -> None:
        if self._scorer is not None:
            self._scorer.shutdown(wait=False, cancel_futures=True)
            self._scorer = None
