"""The math environment (stage 1): one turn, reward 1 for a correct final answer, else 0.

Reward range: {0.0, 1.0}. The final answer is the last ``\\boxed{}`` after the thinking block; AIME
integers compare as numbers (``073`` is 73); anything else is checked by ``math-verify`` in a worker
pool with a hard per-answer timeout (a timed-out check scores 0 and says so in the breakdown).

Config (recipe ``aclarena_env_config.math``): see :class:`MathConfig`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from aclarena_envs.math import deepscaler, routing
from aclarena_envs.math.answer import AnswerRule, UnclosedThink, final_answer
from aclarena_envs.math.exact import decide
from aclarena_envs.math.lane import Lane
from aclarena_envs.math.verifier import Verdict, VerifierPool
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Score, Task
from aclarena_slime.plugin.settings import from_mapping

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# DAPO-Math-17k's own wording around each problem: the authors train on the dataset's prompt field as
# it is, through the chat template (WillDreamer/ACLArena slime/examples/maths_reasoning/
# run-qwen3-8B-base.sh lines 65-68: --prompt-data dapo-math-17k.jsonl --input-key prompt
# --apply-chat-template); our data preparation stores the bare problem.
DAPO_HEAD = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_TAIL = '\n\nRemember to put your answer on its own line after "Answer:".'


@dataclass(frozen=True)
class MathConfig:
    """The env's settings: built strictly, so a misspelt key (``timeout``) is an error, not a default.

    ``prompt``: ``instruction`` appends ``instruction`` to a bare problem (null: leave it alone);
    ``dapo`` wraps it in DAPO-Math-17k's wording, as the authors train. ``answer_rule`` and
    ``unclosed_think``: which ``\\boxed{}`` is the final answer (``answer.py``; the authors':
    ``last`` and ``whole_response``). ``grader``: how an answer is compared with the gold one,
    ``math_verify`` (the exact fast path, then math-verify) or ``deepscaler`` (the authors' --rm-type
    deepscaler rule, ``deepscaler.py``: stricter on unreduced fractions and unevaluated sums, lenient on
    ``\\%``). ``timeout_s``: the hard limit on one math-verify check;
    ``workers``: verifier processes. Caps on what a policy can make the env do: only the last
    ``window_chars`` of a response are searched for the answer, and an answer longer than
    ``max_answer_chars`` scores 0 unchecked. ``demo_max_operand``: the generated demo problems' operands run
    from 0 to it (21 × 21 × 3 = 1,323 distinct problems at 20; a wider range leaves RL more it has not seen).
    """

    prompt: Literal["instruction", "dapo"] = "instruction"
    instruction: str | None = DEFAULT_INSTRUCTION
    answer_rule: AnswerRule = "last_closed"
    unclosed_think: UnclosedThink = "no_answer"
    grader: Literal["math_verify", "deepscaler"] = "math_verify"
    timeout_s: float = 5.0
    workers: int = 2
    window_chars: int = 100_000
    max_answer_chars: int = 1_000
    demo_max_operand: int = 20

    def __post_init__(self) -> None:
        for name, allowed in (
            ("prompt", ("instruction", "dapo")),
            ("answer_rule", ("last_closed", "last")),
            ("unclosed_think", ("no_answer", "whole_response")),
            ("grader", ("math_verify", "deepscaler")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"math env: {name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        if self.window_chars < 1 or self.max_answer_chars < 1:
            raise ValueError("math env: window_chars and max_answer_chars must be positive")
        top = self.demo_max_operand
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise ValueError(f"math env: demo_max_operand must be a positive integer, got {top!r}")


def gold_answer(label: Any) -> str:
    """The gold answer from a record's label: a bare string/number or ``{"answer": ...}``."""
    if isinstance(label, Mapping):
        label = label.get("answer", label.get("ground_truth"))
    if label is None or label == "":
        raise ValueError("math record has no gold answer in its label")
    return str(label).strip()


class MathEpisode(Episode):
    def __init__(
        self, task: Task, conversation: Conversation, pool: VerifierPool, settings: MathConfig, lane: Lane
    ) -> None:
        self.task, self.conversation, self.pool, self.settings, self.lane = task, conversation, pool, settings, lane
        self.response = ""

    async def step(self, text: str) -> Done:
        self.response = text
        return Done("answered")

    async def score(self) -> Score:
        gold = gold_answer(self.task.label)
        outcome = await self.lane.run(lambda: self._grade_here(gold))
        if isinstance(outcome, Score):
            return outcome
        verdict = await self.pool.check(gold, outcome, self.settings.grader)
        return self._score(gold, outcome, verdict)

    def _grade_here(self, gold: str) -> Score | str:
        """The score where the answer is found and decided on the loop, else the answer for math-verify."""
        rules = self.settings
        answer = final_answer(self.response, rules.answer_rule, rules.unclosed_think, rules.window_chars)
        if answer is None:
            return Score(0.0, {"gold": gold, "answer": None, "method": "no_answer"})
        if len(answer) > rules.max_answer_chars:
            shown = answer[:100] + "..."
            return Score(0.0, {"gold": gold, "answer": shown, "method": "too_long", "detail": f"{len(answer)} chars"})
        if rules.grader == "deepscaler":
            correct = deepscaler.decide(answer, gold)
            return answer if correct is None else self._score(gold, answer, Verdict(correct, "deepscaler"))
        decided = decide(gold, answer)
        return answer if decided is None else self._score(gold, answer, Verdict(*decided))

    @staticmethod
    def _score(gold: str, answer: str, verdict: Verdict) -> Score:
        breakdown = {"gold": gold, "answer": answer, "method": verdict.method}
        if verdict.detail:
            breakdown["detail"] = verdict.detail
        return Score(1.0 if verdict.correct else 0.0, breakdown)


class MathEnvironment(Environment):
    tag: ClassVar[str] = "math"
    prepare_data: ClassVar[str] = "aclarena_envs.math.data.main"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.settings = from_mapping(MathConfig, self.config, "config keys of the math env")
        self.pool = VerifierPool(workers=int(self.settings.workers), timeout_s=float(self.settings.timeout_s))
        self.lane = Lane()

    def conversation(self, task: Task) -> Conversation:
        if isinstance(task.prompt, list):
            return Conversation([dict(m) for m in task.prompt])
        instruction = self.settings.instruction
        if self.settings.prompt == "dapo":
            content = f"{DAPO_HEAD}{task.prompt}{DAPO_TAIL}"
        else:
            content = task.prompt if not instruction else f"{task.prompt}\n\n{instruction}".lstrip()
        return Conversation([{"role": "user", "content": content}])

    async def start(self, task: Task) -> MathEpisode:
        return MathEpisode(task, self.conversation(task), self.pool, self.settings, self.lane)

    def check_label(self, label: Any) -> None:
        """The label holds a gold answer (a bare value, or ``{"answer": ...}``)."""
        gold_answer(label)

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """Two-operand arithmetic with integer answers: learnable by a tiny model, scored like AIME."""
        rng = random.Random(seed)
        records, top = [], self.settings.demo_max_operand
        for i in range(n):
            a, b = rng.randint(0, top), rng.randint(0, top)
            op = rng.choice("+-*")
            answer = a + b if op == "+" else a - b if op == "-" else a * b
            records.append(
                {
                    "prompt": f"What is {a} {op} {b}?",
                    "label": str(answer),
                    "metadata": {"env": self.tag, "source": "demo-arithmetic", "index": i},
                }
            )
        return records

    @classmethod
    def routing_prompts(cls, n: int, seed: int = 0) -> list[str]:
        """Half the demo records' prompts, half competition-style problems (:mod:`aclarena_envs.math.routing`)."""
        demo = super().routing_prompts(n // 2, seed)
        return demo + routing.prompts(n - len(demo), seed)

    async def aclose(self) -> None:
        self.pool.close()
