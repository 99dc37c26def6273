"""IFEval's four evaluation numbers — prompt- and instruction-level accuracy, strict and loose — plus per-id rates.

Input is what the env's score breakdown holds for each prompt (``instructions``: ``id``, ``strict``,
``loose``), so an evaluation run aggregates the breakdowns it already has.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class IFEvalMetrics:
    """Accuracies in [0, 1] over ``prompts`` prompts holding ``instructions`` instructions."""

    prompts: int
    instructions: int
    prompt_strict: float
    instruction_strict: float
    prompt_loose: float
    instruction_loose: float
    #: instruction id → (strict accuracy, loose accuracy, count)
    per_instruction: dict[str, tuple[float, float, int]] = field(default_factory=dict)

    def headline(self) -> dict[str, float]:
        """The four numbers IFEval reports, as percentages."""
        return {
            "prompt_level_strict": 100 * self.prompt_strict,
            "instruction_level_strict": 100 * self.instruction_strict,
            "prompt_level_loose": 100 * self.prompt_loose,
            "instruction_level_loose": 100 * self.instruction_loose,
        }


def aggregate(breakdowns: Iterable[Mapping[str, Any]]) -> IFEvalMetrics:
    """Metrics over the per-prompt breakdowns of :func:`aclarena_envs.ifeval.reward.Verdicts.breakdown`."""
    prompts = instructions = 0
    prompt_hits = {"strict": 0, "loose": 0}
    instruction_hits = {"strict": 0, "loose": 0}
    per_id: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for breakdown in breakdowns:
        items = breakdown.get("instructions")
        if not items:
            raise ValueError("a breakdown without per-instruction verdicts cannot be aggregated")
        prompts += 1
        instructions += len(items)
        for mode in ("strict", "loose"):
            prompt_hits[mode] += all(item[mode] for item in items)
            instruction_hits[mode] += sum(bool(item[mode]) for item in items)
        for item in items:
            counts = per_id[item["id"]]
            counts[0] += bool(item["strict"])
            counts[1] += bool(item["loose"])
            counts[2] += 1
    if not prompts:
        raise ValueError("no prompts to aggregate")
    return IFEvalMetrics(
        prompts=prompts,
        instructions=instructions,
        prompt_strict=prompt_hits["strict"] / prompts,
        instruction_strict=instruction_hits["strict"] / instructions,
        prompt_loose=prompt_hits["loose"] / prompts,
        instruction_loose=instruction_hits["loose"] / instructions,
        per_instruction={i: (s / n, lo / n, n) for i, (s, lo, n) in sorted(per_id.items())},
    )
