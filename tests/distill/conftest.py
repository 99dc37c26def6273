"""Synthetic rollout dumps: ``Sample.to_dict()``-shaped dicts as slime's ``--save-debug-rollout-data`` writes them."""

from __future__ import annotations

from typing import Any

import pytest

TOOLS = [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object", "properties": {}}}}]


def sample_dict(
    env: str,
    prompt: str,
    answer: str,
    reward: float | None,
    status: str = "completed",
    *,
    tool_turn: bool = False,
    with_record: bool = True,
) -> dict[str, Any]:
    """What slime saves for one sample our rollout generated (status as a string, plain lists)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    if tool_turn:
        messages += [
            {"role": "assistant", "content": '<tool_call>\n{"name": "get_order", "arguments": {}}\n</tool_call>'},
            {"role": "tool", "name": "get_order", "content": '{"order": "#W1", "status": "delivered"}'},
        ]
    messages.append({"role": "assistant", "content": answer})
    record: dict[str, Any] = {"turns": [m["content"] for m in messages if m["role"] == "assistant"]}
    record["messages"] = messages
    if tool_turn:
        record["tools"] = TOOLS
    if reward is not None:
        record["score"] = {"reward": reward, "breakdown": {}}
    metadata: dict[str, Any] = {"env": env}
    if with_record:
        metadata["aclarena"] = record
    return {
        "group_index": 0,
        "index": 0,
        "prompt": prompt,
        "tokens": [1, 2, 3, 4],
        "response": answer,
        "response_length": 2,
        "label": None,
        "reward": reward,
        "loss_mask": [1, 1],
        "rollout_log_probs": [-0.1, -0.2],
        "status": status,
        "metadata": metadata,
        "remove_sample": False,
        "teacher_log_probs": None,
    }


@pytest.fixture
def make_sample():
    return sample_dict
