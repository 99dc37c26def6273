"""Playing a task's gold actions as if a policy had written them: a self-check of the whole env.

Each gold action goes through the episode as model text (``<tool_call>...</tool_call>``), so the
parser, the argument checks, the tools and the reward are all on the path; a last message says the
task's ``communicate_info``. A scripted customer opens and then stops. The result must be reward 1.0
on every task of τ³'s data (``aclarena retail replay-gold`` prints it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aclarena_envs.retail.data import RetailData, task_record
from aclarena_envs.retail.env import RetailEnvironment
from aclarena_envs.retail.reward import criteria
from aclarena_envs.retail.user_sim import ScriptedUser
from aclarena_slime.plugin.contract import Done, Score, Task


@dataclass(frozen=True)
class GoldEpisode:
    task_id: str
    score: Score
    db_hash: str
    errors: list[str]  # answers of gold actions that were refused


def gold_environment(data: RetailData) -> RetailEnvironment:
    """A retail env whose customer says one line, then stops when the agent first speaks."""
    return RetailEnvironment({}, user_simulator=ScriptedUser(["Hello, I need help with an order."]), data=data)


def tool_call_text(action: Mapping[str, Any]) -> str:
    return (
        f"<tool_call>\n{json.dumps({'name': action['name'], 'arguments': action.get('arguments') or {}})}\n</tool_call>"
    )


async def play_gold(env: RetailEnvironment, task: Mapping[str, Any]) -> GoldEpisode:
    record = task_record(str(task["id"]), "gold")
    episode = await env.start(Task(record["prompt"], record["label"], record["metadata"]))
    errors = []
    for action in criteria(task).get("actions") or []:
        result = await episode.step(tool_call_text(action))
        if isinstance(result, Done):
            break
        errors += [
            f"{action.get('action_id', action['name'])}: {m['content']}"
            for m in result.messages
            if m["content"].startswith("Error: ")
        ]
    infos = criteria(task).get("communicate_info") or []
    await episode.step(("Here is what I found: " + "; ".join(infos)) if infos else "Is there anything else?")
    score = await episode.score()
    await episode.close()
    return GoldEpisode(str(task["id"]), score, episode.db_hash(), errors)
