"""Prompt scoring over SGLang's protocol: ``/generate`` with ``max_new_tokens: 0``, ``return_logprob`` and
``logprob_start_len`` K answers ``meta_info.input_token_logprobs``, ``[logprob, token_id, text]`` for each prompt
position from K on, the first one None, and no output tokens (what MOPD's teachers and the KL predictor call)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.sglang_client import SGLangClient, output_tokens

PROMPTS = ["Write a number.", "hi", "What is 2 + 2?", "Please reason step by step about the capital of France."]


@pytest.fixture
async def engine(engine_model, adapter_dir):
    eng = LocalEngine(engine_model, served_name="tiny")
    async with eng.serve() as url:
        eng.client, eng.url = SGLangClient(url), url
        await eng.client.load_lora_adapter("expert", str(adapter_dir))
        yield eng


def prompt(engine, i: int) -> list[int]:
    return engine.chat.prompt_ids([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])


async def score(engine, ids, start=None, lora=None, temperature=1.0, **extra):
    if start is not None:
        extra["logprob_start_len"] = start
    params = {"max_new_tokens": 0, "temperature": temperature}
    return await engine.client.generate(ids, params, lora_path=lora, extra=extra)


@pytest.mark.parametrize(("lora", "temperature"), [(None, 1.0), ("expert", 1.0), ("expert", 0.7)])
async def test_scores_equal_a_plain_forward_from_the_start_position(
    engine, adapter_dir, reference_log_probs, lora, temperature
):
    ids = prompt(engine, 3)
    for start in (0, 5, len(ids) - 2):
        answer = await score(engine, ids, start, lora, temperature)
        meta = answer["meta_info"]
        entries = meta["input_token_logprobs"]
        assert [e[1] for e in entries] == ids[start:] and entries[0][0] is None
        assert all(e[2] is None for e in entries)  # text only with return_text_in_logprobs
        expected = reference_log_probs(ids[: start + 1], ids[start + 1 :], temperature, adapter_dir if lora else None)
        assert [e[0] for e in entries[1:]] == pytest.approx(expected, abs=2e-3)
        assert max(abs(e[0] - x) for e, x in zip(entries[1:], expected, strict=True)) < 1e-5
        assert answer["output_ids"] == [] and answer["text"] == "" and meta["output_token_logprobs"] == []
        assert meta["completion_tokens"] == 0 and meta["prompt_tokens"] == len(ids)
        assert meta["finish_reason"] == {"type": "length", "length": 0}


async def test_default_start_and_the_prompts_end_report_nothing_and_texts_come_on_request(engine):
    ids = prompt(engine, 0)
    assert (await score(engine, ids))["meta_info"]["input_token_logprobs"] == []  # SGLang's -1 for scoring
    assert (await score(engine, ids, -1))["meta_info"]["input_token_logprobs"] == []
    assert (await score(engine, ids, len(ids)))["meta_info"]["input_token_logprobs"] == []
    assert (await score(engine, ids, len(ids) - 1))["meta_info"]["input_token_logprobs"] == [[None, ids[-1], None]]
    entries = (await score(engine, ids, 2, return_text_in_logprobs=True))["meta_info"]["input_token_logprobs"]
    assert [e[2] for e in entries] == [engine.model.tokenizer.decode([t]) for t in ids[2:]]
    assert "".join(e[2] for e in entries) == engine.model.tokenizer.decode(ids[2:])


async def test_a_generating_request_reports_its_prompt_too_and_samples_the_same(
    engine, adapter_dir, reference_log_probs
):
    ids, other = prompt(engine, 2), prompt(engine, 1)
    params = {"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": 4}
    plain = await engine.client.generate(ids, params)
    assert plain["meta_info"]["input_token_logprobs"] == [[None, ids[-1], None]]  # SGLang's default: the last token
    plain_other = await engine.client.generate(other, params, lora_path="expert")
    # Sent together, so that they are likely to share a prefill: one asking from 0, one not asking, one only scored.
    asked, not_asked, scored = await asyncio.gather(
        engine.client.generate(ids, params, extra={"logprob_start_len": 0}),
        engine.client.generate(other, params, lora_path="expert"),
        score(engine, ids, 1, "expert"),
    )
    assert output_tokens(asked)[0] == output_tokens(plain)[0]  # the log-probs too, to float32 rounding:
    assert output_tokens(asked)[1] == pytest.approx(output_tokens(plain)[1], abs=1e-5)  # their batch-mates differ
    assert output_tokens(not_asked)[0] == output_tokens(plain_other)[0]
    entries = asked["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == ids and entries[0][0] is None
    assert [e[0] for e in entries[1:]] == pytest.approx(reference_log_probs(ids[:1], ids[1:], 1.0), abs=1e-5)
    expected = reference_log_probs(ids[:2], ids[2:], 1.0, adapter_dir)
    assert [e[0] for e in scored["meta_info"]["input_token_logprobs"][1:]] == pytest.approx(expected, abs=1e-5)


async def test_scoring_beside_generating_requests_leaves_them_as_they_were(engine, adapter_dir, reference_log_probs):
    """Scoring requests join the running batch's prefill and leave it at once; the others decode on undisturbed."""
    params = {"max_new_tokens": 160, "temperature": 1.0, "ignore_eos": True}
    jobs = [(prompt(engine, i), "expert" if i % 2 else None, {**params, "sampling_seed": i}) for i in range(6)]

    async def generate_all():
        return await asyncio.gather(*(engine.client.generate(ids, p, lora_path=lora) for ids, lora, p in jobs))

    alone = await generate_all()
    running = asyncio.ensure_future(generate_all())
    for _ in range(2000):  # until they decode (no clock: the scores' batch-mates are what matters)
        if engine.model.num_running == len(jobs):
            break
        await asyncio.sleep(0.005)
    assert engine.model.num_running == len(jobs)
    scored = [(prompt(engine, i), "expert" if i % 3 else None, i % 5) for i in range(5)]
    answers = await asyncio.gather(*(score(engine, ids, start, lora) for ids, lora, start in scored))
    assert not running.done()  # the scores came back while the generations were still decoding
    beside = await running
    for a, b in zip(alone, beside, strict=True):
        assert output_tokens(a)[0] == output_tokens(b)[0]
        assert output_tokens(a)[1] == pytest.approx(output_tokens(b)[1], abs=1e-5)
    for (ids, lora, start), answer in zip(scored, answers, strict=True):
        got = [e[0] for e in answer["meta_info"]["input_token_logprobs"][1:]]
        adapter = adapter_dir if lora else None
        assert got == pytest.approx(reference_log_probs(ids[: start + 1], ids[start + 1 :], 1.0, adapter), abs=1e-5)
    assert engine.model.num_running == 0


@pytest.mark.parametrize(
    ("extra", "max_new_tokens", "words"),
    [
        ({"logprob_start_len": 99}, 0, "is higher than the number of input tokens"),
        ({"logprob_start_len": 7}, 4, "is higher than the number of input tokens"),  # SGLang: a generating request
        ({"logprob_start_len": -2}, 0, "logprob_start_len must be -1"),
        ({"logprob_start_len": "3"}, 0, "logprob_start_len must be -1"),
        ({"logprob_start_len": 2, "lora_path": "nobody"}, 0, "not loaded"),
        ({"logprob_start_len": 2, "top_logprobs_num": 5}, 0, "not served by the local engine"),
    ],
)
async def test_bad_scoring_requests_get_sglangs_error(engine, extra, max_new_tokens, words):
    payload = {"input_ids": list(range(10, 17)), "sampling_params": {"max_new_tokens": max_new_tokens}}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{engine.url}/generate", json={**payload, "return_logprob": True, **extra}) as resp:
            assert resp.status == 400
            assert words in (await resp.json())["error"]["message"]
        # Without return_logprob SGLang ignores logprob_start_len; the engine still serves.
        plain = {**payload, "logprob_start_len": extra["logprob_start_len"]}
        async with session.post(f"{engine.url}/generate", json=plain) as resp:
            assert resp.status == 200
