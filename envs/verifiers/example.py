"""A small verifiers env to try the bridge with (``env_id: aclarena_envs.verifiers.example``): sums of two numbers.

A ``SingleTurnEnv`` built the way a hub env's ``load_environment`` builds one: a dataset of questions and answers,
a system prompt and a rubric (exact match of the reply). The stage recipe's default, so
``bash launch/stage.sh recipes/verifiers.yaml`` runs as it is.
"""

from __future__ import annotations

import random
from typing import Any


def load_environment(num_examples: int = 1000, seed: int = 0) -> Any:
    import verifiers as vf
    from datasets import Dataset

    rng = random.Random(seed)
    pairs = [(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(num_examples)]
    dataset = Dataset.from_list([{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in pairs])

    def exact_answer(completion: Any, answer: str, **_: Any) -> float:
        return float(str(completion[-1].content or "").strip() == answer)

    return vf.SingleTurnEnv(
        dataset=dataset, system_prompt="Answer with the number only.", rubric=vf.Rubric(funcs=[exact_answer])
    )
