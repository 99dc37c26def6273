"""The τ³-Retail reward: does the agent's database equal the one the gold actions produce?

Following τ³'s evaluators (``evaluator_env.py``, ``evaluator_communicate.py``): the gold actions are
replayed on a fresh copy of the database (a gold action that fails is skipped, as τ³ does), and the
episode's final database hash is compared with that. ``DB`` in the task's ``reward_basis`` makes the
match a factor of the reward; ``COMMUNICATE`` adds the check that each ``communicate_info`` string
appears in some agent message (case-insensitive, commas removed). ``NL_ASSERTION`` needs an LLM judge
and is not part of an RL reward: it is recorded as not evaluated, as is any other basis we do not score.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aclarena_envs.retail.db import RetailDatabase, canonical_hash
from aclarena_envs.retail.tools import RetailTools
from aclarena_slime.plugin.contract import Score

SCORED_BASES = ("DB", "COMMUNICATE")
DEFAULT_BASIS = ("DB", "COMMUNICATE")  # τ³'s default when a task names none (``data_model/tasks.py``)


@dataclass(frozen=True)
class GoldReplay:
    db_hash: str
    errors: list[str]  # messages of gold actions that failed (τ³'s data has a few; they change nothing)


def criteria(task: Mapping[str, Any]) -> dict[str, Any]:
    return dict(task.get("evaluation_criteria") or {})


def replay_gold(base: RetailDatabase, task: Mapping[str, Any]) -> GoldReplay:
    """Run the task's gold actions on a fresh database; the final hash and any refused actions."""
    tools = RetailTools(base.fresh())
    errors = []
    for action in criteria(task).get("actions") or []:
        result = tools.call(action["name"], action.get("arguments") or {})
        if result.error:
            errors.append(f"{action.get('action_id', action['name'])}: {result.content}")
    return GoldReplay(canonical_hash(tools.db), errors)


def communicate_checks(infos: Sequence[str], agent_messages: Iterable[str]) -> list[dict[str, Any]]:
    """For each required string, whether an agent message contains it (τ³'s rule)."""
    said = [m.lower().replace(",", "") for m in agent_messages if m]
    return [{"info": info, "met": any(info.lower() in m for m in said)} for info in infos]


def score_episode(
    task: Mapping[str, Any], agent_db_hash: str, gold_db_hash: str, agent_messages: Sequence[str]
) -> Score:
    """Reward and breakdown for a finished episode (1.0 or 0.0, as in τ³)."""
    crit = criteria(task)
    basis = list(crit.get("reward_basis") if crit.get("reward_basis") is not None else DEFAULT_BASIS)
    db_match = agent_db_hash == gold_db_hash
    checks = communicate_checks(crit.get("communicate_info") or [], agent_messages)
    communicated = all(c["met"] for c in checks)

    reward = 1.0
    if "DB" in basis:
        reward *= 1.0 if db_match else 0.0
    if "COMMUNICATE" in basis:
        reward *= 1.0 if communicated else 0.0
    return Score(
        reward,
        {
            "task_id": str(task.get("id")),
            "reward_basis": basis,
            "db": {
                "match": db_match,
                "agent_hash": agent_db_hash,
                "gold_hash": gold_db_hash,
                "in_reward": "DB" in basis,
            },
            "communicate": {"met": communicated, "checks": checks, "in_reward": "COMMUNICATE" in basis},
            "nl_assertions": {"count": len(crit.get("nl_assertions") or []), "evaluated": False},
            "not_evaluated": [b for b in basis if b not in SCORED_BASES],
        },
    )
