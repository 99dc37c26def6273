"""``reasoning_gym``: any reasoning-gym task, or a weighted mix of them, as a single-turn env.

The model answers inside ``<answer>...</answer>`` (reasoning-gym's own convention; thinking before
``</think>`` is ignored) and the task's ``score_answer`` scores the last such answer against the entry
the generator made, regenerated from the record's metadata (``data.py``). Reward in [0, 1], as the
library's. Config (recipe ``env_config.reasoning_gym``, or ``env_config.<variant tag>`` under a variant tag such as
``reasoning_gym-spell_backward``; :class:`ReasoningGymConfig`): ``tasks`` (a name,
a list, or ``{name: weight}``), ``task_config`` (``{name: create_dataset kwargs}``, e.g. a difficulty),
``instruction``, ``max_answer_chars``, ``score_timeout_s``.

Failures: an answer the scorer chokes on (it raises, or runs past ``score_timeout_s`` on its thread) is a
score of 0 with the reason in the breakdown; a record the library cannot regenerate fails the sample
(the loop records the reason) instead of scoring the model for the env's fault.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aclarena_envs.reasoning_gym import data
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Score, Task
from aclarena_slime.plugin.settings import from_mapping

_OPEN, _CLOSE = f"<{data.ANSWER_TAG}>", f"</{data.ANSWER_TAG}>"
_DATASETS_KEPT = 64  # generators kept per env (one per task, seed and size in use)


@dataclass(frozen=True)
class ReasoningGymConfig:
    """The env's settings (recipe ``env_config.reasoning_gym``)."""

    tasks: Any = "spell_backward"
    task_config: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    instruction: str = f"Give your final answer inside {_OPEN}{_CLOSE} tags."
    max_answer_chars: int = 2000  # a longer answer scores 0 unread (the scorers are not all linear)
    score_timeout_s: float = 10.0


def extract_answer(text: str) -> str | None:
    """The last ``<answer>...</answer>`` after any thinking, stripped; linear in ``len(text)``."""
    visible = text.rsplit("</think>", 1)[-1]
    end = visible.rfind(_CLOSE)
    if end < 0:
        return None
    start = visible.rfind(_OPEN, 0, end)
    return None if start < 0 else visible[start + len(_OPEN) : end].strip()


class ReasoningGymEpisode(Episode):
    def __init__(self, env: ReasoningGymEnvironment, task: Task, name: str) -> None:
        self.env, self.task, self.name, self.text = env, task, name, ""
        if isinstance(task.prompt, str):
            messages = [{"role": "user", "content": f"{task.prompt}\n\n{env.settings.instruction}".strip()}]
        else:
            messages = [dict(m) for m in task.prompt]
        self.conversation = Conversation(messages)

    async def step(self, text: str) -> Done:
        self.text = text
        return Done("answered")

    async def score(self) -> Score:
        return await self.env.score_answer(self.task, self.name, self.text)


class ReasoningGymEnvironment(Environment):
    tag: ClassVar[str] = data.TAG
    prepare_data: ClassVar[str | None] = "aclarena_envs.reasoning_gym.data.main"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.settings = from_mapping(ReasoningGymConfig, self.config, "config keys of the reasoning_gym env")
        self.weights = data.weights_of(self.settings.tasks)  # also: the library is installed, the names exist
        unknown = sorted(set(self.settings.task_config) - set(self.weights))
        if unknown:
            raise ValueError(f"reasoning_gym: task_config names tasks not in tasks: {unknown}")
        if self.settings.max_answer_chars < 1 or not self.settings.score_timeout_s > 0:
            raise ValueError("reasoning_gym: max_answer_chars and score_timeout_s must be positive")
        self._datasets: dict[str, Any] = {}

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        return data.records(self.weights, n, seed, self.settings.task_config, tag=self.tag)

    async def start(self, task: Task) -> ReasoningGymEpisode:
        name = task.metadata.get("task")
        if name is None and len(self.weights) == 1:
            name = next(iter(self.weights))
        if name not in data.library().factory.DATASETS:
            raise ValueError(f"a reasoning_gym record needs metadata.task naming a reasoning-gym task, got {name!r}")
        return ReasoningGymEpisode(self, task, str(name))

    async def score_answer(self, task: Task, name: str, text: str) -> Score:
        """The task's own ``score_answer`` on the extracted answer, on a thread under the timeout."""
        answer = extract_answer(text)
        breakdown: dict[str, Any] = {"task": name, "answer": None if answer is None else answer[:200]}
        if answer is None:
            return Score(0.0, {**breakdown, "reason": f"no {_OPEN}...{_CLOSE} after the thinking"})
        if len(answer) > self.settings.max_answer_chars:
            return Score(0.0, {**breakdown, "reason": f"answer longer than {self.settings.max_answer_chars} characters"})
        generator, entry, source = self._entry(task, name)
        try:
            value = await asyncio.wait_for(
                asyncio.to_thread(generator.score_answer, answer, entry), self.settings.score_timeout_s
            )
            reward = float(value)
        except asyncio.TimeoutError:
            return Score(0.0, {**breakdown, "entry": source, "reason": f"score_answer ran past {self.settings.score_timeout_s:g} s"})
        except Exception as exc:  # noqa: BLE001 - the library's scorer choked on what the model wrote
            return Score(0.0, {**breakdown, "entry": source, "reason": f"score_answer raised {type(exc).__name__}: {str(exc)[:200]}"})
        reward = min(max(reward, 0.0), 1.0) if reward == reward else 0.0  # NaN scores 0
        return Score(reward, {**breakdown, "entry": source})

    def _entry(self, task: Task, name: str) -> tuple[Any, dict[str, Any], str]:
        """The generator and the entry to score against: regenerated from the record's metadata when it says
        where it came from and the question matches ("generator"), else the record's own label ("label")."""
        md = task.metadata
        config = md.get("config") or self.settings.task_config.get(name) or {}
        where = (md.get("seed"), md.get("size"), md.get("item"))
        if all(isinstance(v, int) for v in where):
            generator = self._dataset(name, where[0], where[1], config)
            entry = generator[where[2]]
            if not isinstance(task.prompt, str) or entry["question"] == task.prompt:
                return generator, entry, "generator"
        generator = self._dataset(name, 0, 1, config)
        label = task.label if isinstance(task.label, str) else json.dumps(task.label_value)
        return generator, {"question": task.prompt, "answer": label, "metadata": {}}, "label"

    def _dataset(self, name: str, seed: int, size: int, config: Mapping[str, Any]) -> Any:
        key = json.dumps([name, seed, size, config], sort_keys=True, default=str)
        if key not in self._datasets:
            if len(self._datasets) >= _DATASETS_KEPT:
                self._datasets.clear()
            self._datasets[key] = data.dataset(name, seed, size, config)
        return self._datasets[key]
