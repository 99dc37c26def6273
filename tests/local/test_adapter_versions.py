"""Versioned adapters on the local engine: k versions resident, episodes pinned, staleness, unloads, checksums."""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable

import pytest

from aclarena_slime.adapter_swap import (
    AdapterLedger,
    AdapterSwapError,
    adapter_checksum,
    files_checksum,
    split_version,
    swap_adapter,
    versioned_name,
)
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.experts import ExpertTable
from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.generation import SamplingParams
from aclarena_slime.plugin import registry
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Observation, Score
from aclarena_slime.rollout import Budgets, RolloutContext, run_sample
from aclarena_slime.sglang_client import SGLangClient, SGLangError
from aclarena_slime.testing.samples import FakeSample

TURNS = 3


@pytest.fixture
async def engine(engine_model):
    eng = LocalEngine(engine_model, served_name="tiny")
    seen: list[str | None] = []
    generate = eng.generate

    async def recording(input_ids, params, adapter, *rest):
        seen.append(adapter)
        return await generate(input_ids, params, adapter, *rest)

    eng.generate = recording  # the /generate handler calls it: records each turn's adapter
    async with eng.serve() as url:
        eng.client = SGLangClient(url)
        eng.seen = seen
        yield eng


class _Talk(Episode):
    def __init__(self, after_turn: Callable[[int], Awaitable[None]]) -> None:
        self.conversation = Conversation([{"role": "user", "content": "Say something."}])
        self.turn, self.after_turn = 0, after_turn

    async def step(self, text):
        self.turn += 1
        await self.after_turn(self.turn)
        return Done() if self.turn == TURNS else Observation([{"role": "user", "content": "More."}])

    async def score(self):
        return Score(1.0, {"turns": self.turn})


def _register(after_turn: Callable[[int], Awaitable[None]]) -> str:
    class Talk(Environment):
        tag = "talk"
        max_turns = TURNS

        async def start(self, task):
            return _Talk(after_turn)

    registry.register(Talk.tag, lambda config: Talk())
    return Talk.tag


def _context(engine, ledger: AdapterLedger) -> RolloutContext:
    return RolloutContext(
        engine_url=engine.client.base_url,
        load_chat=lambda: ChatTokens(engine.model.tokenizer),
        budgets=Budgets(max_response_len=64, mode="per_turn"),
        experts=ExpertTable.from_mapping({"talk": "expert"}),
        ledger=ledger,
    )


async def _publish(engine, adapter_dir, ledger, version: int, budget: int):
    return await swap_adapter(
        [engine.client], "expert", adapter_dir, version=version, staleness_budget=budget, ledger=ledger
    )


def _params(engine) -> dict:
    """One token a turn, ending on a stop (every token stops it): a turn that hits its length ends the episode."""
    return {"temperature": 1.0, "max_new_tokens": 4, "stop_token_ids": list(range(engine.model.vocab_size))}


def test_versioned_names():
    assert versioned_name("search", 12) == "search@12"
    assert split_version("search@12") == ("search", 12)
    assert split_version("search") == ("search", None)
    with pytest.raises(ValueError, match="non-negative"):
        versioned_name("search", -1)


async def test_last_k_versions_stay_resident_and_older_ones_are_unloaded(engine, adapter_dir, tmp_path):
    ledger = AdapterLedger(tmp_path)
    for version in range(4):
        result = await _publish(engine, adapter_dir, ledger, version, budget=1)
        resident = [f"expert@{v}" for v in (version - 1, version) if v >= 0]
        assert sorted(engine.model.adapters) == resident
        assert ledger.current("expert").served == result.served == f"expert@{version}"
        assert ledger.resident("expert") == [int(n.split("@")[1]) for n in resident]
        assert result.unloaded == ((f"expert@{version - 2}",) if version >= 2 else ())


async def test_an_episode_keeps_its_version_for_all_turns_and_records_staleness(engine, adapter_dir, tmp_path):
    ledger = AdapterLedger(tmp_path)
    await _publish(engine, adapter_dir, ledger, 0, budget=2)

    versions = iter(range(1, 10))

    async def sync_after_first_turn(turn: int) -> None:
        if turn == 1:  # a weight update lands in the middle of each conversation
            await _publish(engine, adapter_dir, ledger, next(versions), budget=2)

    tag = _register(sync_after_first_turn)
    async with _context(engine, ledger) as context:
        first = await run_sample(context, FakeSample(prompt="p", metadata={"env": tag}), _params(engine))
        assert engine.seen == ["expert@0"] * TURNS  # all three turns on the version the episode started on
        assert first.metadata["aclarena"]["adapter"] == {"name": "expert@0", "version": 0, "staleness": 1}
        engine.seen.clear()
        second = await run_sample(context, FakeSample(prompt="p", metadata={"env": tag}), _params(engine))
    assert engine.seen == ["expert@1"] * TURNS  # a new episode starts on the newest version
    assert second.metadata["aclarena"]["adapter"] == {"name": "expert@1", "version": 1, "staleness": 1}
    assert sorted(engine.model.adapters) == ["expert@0", "expert@1", "expert@2"]


async def test_an_episode_beyond_the_budget_ends_and_is_not_trained_on(engine, adapter_dir, tmp_path):
    ledger = AdapterLedger(tmp_path)
    await _publish(engine, adapter_dir, ledger, 0, budget=0)

    async def sync(turn: int) -> None:
        if turn == 1:
            await _publish(engine, adapter_dir, ledger, 1, budget=0)  # expert@0 goes once nothing holds it

    tag = _register(sync)
    async with _context(engine, ledger) as context:
        sample = await run_sample(context, FakeSample(prompt="p", metadata={"env": tag}), _params(engine))
    assert sample.metadata["aclarena"]["end"] == "adapter_retired"
    assert sample.status is FakeSample.Status.ABORTED and sample.remove_sample
    assert engine.seen == ["expert@0"]  # turn 2 asked for expert@0 too and was refused: it was gone


async def test_a_retired_version_is_unloaded_only_after_its_requests_finish(engine, adapter_dir, tmp_path):
    ledger = AdapterLedger(tmp_path)
    await _publish(engine, adapter_dir, ledger, 0, budget=0)
    ids = engine.chat.prompt_ids([{"role": "user", "content": "Go on."}])
    holder = engine.model.submit(ids, SamplingParams(max_new_tokens=40, ignore_eos=True), "expert@0")
    result = await _publish(engine, adapter_dir, ledger, 1, budget=0)
    assert result.unloaded == ("expert@0",)
    finished = holder.future.result(timeout=0)  # the unload returned, so its request was done before
    assert finished.finish["type"] == "length" and len(finished.output_ids) == 40  # whole, not aborted
    assert sorted(engine.model.adapters) == ["expert@1"]


async def test_the_engine_refuses_files_that_do_not_match_their_checksum(engine, adapter_dir, tmp_path):
    copy = shutil.copytree(adapter_dir, tmp_path / "copy")
    checksum = adapter_checksum(copy)
    body = {"lora_name": "x", "lora_path": str(copy), "checksum": checksum}
    await engine.client.post("/load_lora_adapter", body)
    assert "x" in engine.model.adapters
    config = copy / "adapter_config.json"
    config.write_text(config.read_text().replace('"r": 4', '"r": 4 '))  # same meaning, other bytes
    with pytest.raises(SGLangError, match="do not match their checksum"):
        await engine.client.post("/load_lora_adapter", {**body, "lora_name": "y"})
    assert "y" not in engine.model.adapters
    with pytest.raises(AdapterSwapError, match="do not match"):  # the caller checks too, before any load
        await swap_adapter([engine.client], "z", copy, checksum=checksum, loaded=False)
    assert "z" not in engine.model.adapters


def test_the_writers_checksum_is_the_one_of_the_folder_it_writes(tmp_path):
    import torch

    from aclarena_slime.lora.export import peft_files, write_peft_dir

    tensors = {"base_model.model.lm_head.lora_A.weight": torch.arange(6.0).reshape(2, 3)}
    config = {"r": 2, "peft_type": "LORA"}
    expected = files_checksum(peft_files(tensors, config))
    assert adapter_checksum(write_peft_dir(tmp_path / "a", tensors, config)) == expected
    tensors["base_model.model.lm_head.lora_A.weight"][0, 0] = 1.0
    assert files_checksum(peft_files(tensors, config)) != expected


async def test_swap_adapter_refuses_what_cannot_work(engine, adapter_dir):
    with pytest.raises(ValueError, match="ledger"):
        await swap_adapter([engine.client], "expert", adapter_dir, version=1)
    with pytest.raises(ValueError, match="exactly one"):
        await swap_adapter([engine.client], "expert")
    with pytest.raises(AdapterSwapError, match="not an adapter folder"):
        await swap_adapter([engine.client], "expert", adapter_dir / "missing", checksum="0")


async def test_an_unversioned_swap_replaces_the_adapter_in_place(engine, adapter_dir):
    await swap_adapter([engine.client], "expert", adapter_dir, loaded=False)
    await swap_adapter([engine.client], "expert", adapter_dir)
    assert sorted(engine.model.adapters) == ["expert"]


async def test_a_plain_adapter_that_is_not_loaded_is_still_an_error(engine, tmp_path):
    """Only a versioned episode's adapter can retire; a plain name that is missing is a setup error."""

    async def nothing(turn: int) -> None:
        return None

    tag = _register(nothing)
    context = _context(engine, AdapterLedger(tmp_path))  # empty ledger: the plain name is requested
    async with context:
        with pytest.raises(SGLangError, match="not loaded"):
            await run_sample(context, FakeSample(prompt="p", metadata={"env": tag}), _params(engine))
