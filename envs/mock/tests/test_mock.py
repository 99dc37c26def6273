"""The mock (guessing game) env: its settings are strict, and it keeps the contract."""

from __future__ import annotations

import pytest

from aclarena_envs.mock.env import MockEnvironment
from aclarena_slime.plugin.conformance import check_environment, check_hostile_outputs
from aclarena_slime.plugin.contract import Task


def test_settings_are_read_and_misspelt_keys_refused():
    assert MockEnvironment({"max_turns": 5}).max_turns == 5
    assert MockEnvironment({}).max_turns == 3
    with pytest.raises(ValueError, match=r"unknown config keys of the mock env \['max_turn'\]; known: \['max_turns'\]"):
        MockEnvironment({"max_turn": 5})


async def test_mock_conforms():
    env = MockEnvironment({})
    await check_environment(env, [Task(**r) for r in env.demo_records(2)], turns=["<guess>fig</guess>"])


async def test_mock_survives_hostile_turns():
    env = MockEnvironment({})
    await check_hostile_outputs(env, [Task(**r) for r in env.demo_records(1)])
