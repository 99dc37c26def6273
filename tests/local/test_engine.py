"""The embedded engine over HTTP, through the same client the rollout uses."""

from __future__ import annotations

import aiohttp
import pytest

from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.generation import SamplingParams
from aclarena_slime.sglang_client import SGLangClient, SGLangError, finish_reason, output_tokens


@pytest.fixture
async def engine(engine_model):
    eng = LocalEngine(engine_model, served_name="tiny")
    async with eng.serve() as url:
        eng.client = SGLangClient(url)
        eng.url = url
        yield eng


def prompt_ids(engine, text="Write a number."):
    return engine.chat.prompt_ids([{"role": "user", "content": text}])


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
async def test_log_probs_are_the_trainers(engine, temperature, reference_log_probs):
    ids = prompt_ids(engine)
    params = {"temperature": temperature, "max_new_tokens": 12, "sampling_seed": 3}
    response = await engine.client.generate(ids, params)
    out, log_probs = output_tokens(response)
    assert out and len(out) == len(log_probs) == response["meta_info"]["completion_tokens"]
    assert log_probs == pytest.approx(reference_log_probs(ids, out, temperature), abs=1e-5)


async def test_adapter_changes_output_and_log_probs_follow_it(engine, adapter_dir, reference_log_probs):
    ids = prompt_ids(engine)
    await engine.client.load_lora_adapter("expert", str(adapter_dir))
    params = {"temperature": 0.0, "max_new_tokens": 8}
    base = output_tokens(await engine.client.generate(ids, params))
    tuned = output_tokens(await engine.client.generate(ids, params, lora_path="expert"))
    assert base[0] != tuned[0]
    assert tuned[1] == pytest.approx(reference_log_probs(ids, tuned[0], 1.0, adapter_dir), abs=1e-5)
    # The base model is untouched by the loaded adapter.
    assert output_tokens(await engine.client.generate(ids, params)) == base


async def test_sampling_seed_makes_a_request_reproducible(engine):
    ids = prompt_ids(engine)
    params = {"temperature": 1.0, "max_new_tokens": 10}
    first = await engine.client.generate(ids, {**params, "sampling_seed": 7})
    again = await engine.client.generate(ids, {**params, "sampling_seed": 7})
    other = await engine.client.generate(ids, {**params, "sampling_seed": 8})
    assert output_tokens(first) == output_tokens(again)
    assert output_tokens(first) != output_tokens(other)


async def test_budget_gives_length_and_eos_gives_stop(engine):
    ids = prompt_ids(engine)
    response = await engine.client.generate(ids, {"max_new_tokens": 3, "temperature": 1.0, "sampling_seed": 1})
    assert finish_reason(response) == "length" and len(output_tokens(response)[0]) == 3
    eos = engine.model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    # Making every token a stop token: the first token ends the turn with "stop" and is kept, as SGLang does.
    every = list(range(engine.model.vocab_size))
    response = await engine.client.generate(ids, {"max_new_tokens": 5, "stop_token_ids": every})
    assert finish_reason(response) == "stop" and len(output_tokens(response)[0]) == 1
    assert eos in engine.model.eos_ids


async def test_stop_string_ends_the_turn_and_is_trimmed_from_text(engine_model):
    # Stop on the most likely next character: the greedy continuation's first token text.
    eng = LocalEngine(engine_model)
    ids = eng.chat.prompt_ids([{"role": "user", "content": "hi"}])
    free = await eng.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=6), None)
    second = engine_model.tokenizer.decode(free.output_ids[1:2])
    stopped = await eng.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=6, stop=(second,)), None)
    assert stopped.finish == {"type": "stop", "matched": second}
    assert stopped.output_ids == free.output_ids[: len(stopped.output_ids)]
    assert len(stopped.output_ids) <= 2
    full_text = engine_model.decode(stopped.output_ids)
    assert full_text.endswith(second) and eng._text(stopped) == full_text[: -len(second)]


async def test_load_unload_protocol(engine, adapter_dir):
    await engine.client.load_lora_adapter("a", str(adapter_dir))
    await engine.client.load_lora_adapter("b", str(adapter_dir))
    models = await engine.client.get("/v1/models")
    assert [m["id"] for m in models["data"]] == ["tiny", "tiny:a", "tiny:b"]
    with pytest.raises(SGLangError, match="already loaded"):
        await engine.client.load_lora_adapter("a", str(adapter_dir))
    await engine.client.unload_lora_adapter("a")
    with pytest.raises(SGLangError, match="not loaded"):
        await engine.client.generate(prompt_ids(engine), {"max_new_tokens": 2}, lora_path="a")
    with pytest.raises(SGLangError, match="not loaded"):
        await engine.client.unload_lora_adapter("a")
    with pytest.raises(SGLangError, match="not a PEFT adapter"):
        await engine.client.load_lora_adapter("c", str(adapter_dir.parent / "missing"))
    with pytest.raises(SGLangError, match="invalid adapter name"):
        await engine.client.load_lora_adapter("../x", str(adapter_dir))
    assert await engine.client.healthy()


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"input_ids": "abc"}, "input_ids"),
        ({"input_ids": [[1, 2]]}, "input_ids"),
        ({"input_ids": [999999]}, "token ids in"),
        ({"input_ids": [1], "sampling_params": {"temprature": 1}}, "temprature"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": "many"}}, "sampling_params"),
        ({"input_ids": [1] * 40_000}, "exceeds the context"),
    ],
)
async def test_bad_requests_get_a_400_naming_the_problem(engine, payload, words):
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{engine.url}/generate", json=payload) as resp:
            assert resp.status == 400
            assert words in (await resp.json())["error"]["message"]
        async with session.post(f"{engine.url}/generate", data=b"{not json") as resp:
            assert resp.status == 400


async def test_text_input_and_chat_completions(engine, adapter_dir):
    response = await engine.client.post("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 4}})
    assert response["meta_info"]["completion_tokens"] >= 1 and "output_token_logprobs" not in response["meta_info"]
    await engine.client.load_lora_adapter("expert", str(adapter_dir))
    body = {"model": "tiny:expert", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "seed": 1}
    answer = await engine.client.post("/v1/chat/completions", body)
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["usage"]["completion_tokens"] <= 5
    assert answer["choices"][0]["finish_reason"] in ("stop", "length")
    with pytest.raises(SGLangError, match="not served here"):
        await engine.client.post("/v1/chat/completions", {**body, "model": "gpt-4o"})
    with pytest.raises(SGLangError, match="stream"):
        await engine.client.post("/v1/chat/completions", {**body, "stream": True})
