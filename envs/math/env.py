"""The math environment (stage 1): one turn, reward 1 for a correct final answer, else 0.

Reward range: {0.0, 1.0}. The final answer is the last ``\\boxed{}`` after the thinking block; AIME
integers compare as numbers (``073`` is 73); anything else is checked by ``math-verify`` in a worker
pool with a hard per-answer timeout (a timed-out check scores 0 and says so in the breakdown).

Config (recipe ``aclarena_env_config.math``): ``instruction`` (appended to a bare problem; null to
leave the prompt alone), ``timeout_s`` (per answer, default 5), ``workers`` (verifier processes, 2).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from aclarena_envs.math.answer import final_answer
from aclarena_envs.math.verifier import VerifierPool, verify_answer
from aclarena_slime.contract import Conversation, Done, Environment, Episode, Score, Task
from aclarena_slime.strict_config import from_mapping

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class MathConfig:
    """The env's settings: built strictly, so a misspelt key (``timeout``) is an error, not a default."""

    instruction: str | None = DEFAULT_INSTRUCTION
    timeout_s: float = 5.0
    workers: int = 2


def gold_answer(label: Any) -> str:
    """The gold answer from a record's label: a bare string/number or ``{"answer": ...}``."""
    if isinstance(label, Mapping):
        label = label.get("answer", label.get("ground_truth"))
    if label is None or label == "":
        raise ValueError("math record has no gold answer in its label")
    return str(label).strip()


class MathEpisode(Episode):
    def __init__(self, task: Task, conversation: Conversation, pool: VerifierPool) -> None:
        self.task, self.conversation, self.pool = task, conversation, pool
        self.response = ""

    async def step(self, text: str) -> Done:
        self.response = text
        return Done("answered")

    async def score(self) -> Score:
        gold = gold_answer(self.task.label)
        answer = final_answer(self.response)
        if answer is None:
            return Score(0.0, {"gold": gold, "answer": None, "method": "no_answer"})
        verdict = await verify_answer(gold, answer, self.pool)
        breakdown = {"gold": gold, "answer": answer, "method": verdict.method}
        if verdict.detail:
            breakdown["detail"] = verdict.detail
        return Score(1.0 if verdict.correct else 0.0, breakdown)


class MathEnvironment(Environment):
    tag: ClassVar[str] = "math"
    prepare_data: ClassVar[str] = "aclarena_envs.math.data.main"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        settings = from_mapping(MathConfig, self.config, "config keys of the math env")
        self.instruction = settings.instruction
        self.pool = VerifierPool(workers=int(settings.workers), timeout_s=float(settings.timeout_s))

    def conversation(self, task: Task) -> Conversation:
        if isinstance(task.prompt, list):
            return Conversation([dict(m) for m in task.prompt])
        content = task.prompt if not self.instruction else f"{task.prompt}\n\n{self.instruction}".lstrip()
        return Conversation([{"role": "user", "content": content}])

    async def start(self, task: Task) -> MathEpisode:
        return MathEpisode(task, self.conversation(task), self.pool)

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """Two-operand arithmetic with integer answers: learnable by a tiny model, scored like AIME."""
        rng = random.Random(seed)
        records = []
        for i in range(n):
            a, b = rng.randint(0, 20), rng.randint(0, 20)
            op = rng.choice("+-*")
            answer = a + b if op == "+" else a - b if op == "-" else a * b
            records.append(
                {
                    "prompt": f"What is {a} {op} {b}?",
                    "label": str(answer),
                    "metadata": {"env": "math", "source": "demo-arithmetic", "index": i},
                }
            )
        return records

    async def aclose(self) -> None:
        self.pool.close()
