"""Continuous batching: requests in flight decode together, on mixed adapters, with the answers of one at a time."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from aclarena_slime.local.config import EngineSettings, LocalConfigError
from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.generation import GenerationError, MultiLoraModel, SamplingParams
from aclarena_slime.local.sampling import sample
from aclarena_slime.local.sglang_server import SGLangServer
from aclarena_slime.sglang_client import SGLangClient, SGLangError, output_tokens

PROMPTS = ["Write a number.", "hi", "What is 2 + 2?", "Please reason step by step about the capital of France."]


@pytest.fixture
async def engine(engine_model, adapter_dir):
    eng = LocalEngine(engine_model, served_name="tiny")
    async with eng.serve() as url:
        eng.client = SGLangClient(url)
        await eng.client.load_lora_adapter("expert", str(adapter_dir))
        yield eng


def prompt(engine, i):
    return engine.chat.prompt_ids([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])


async def until(condition, tries=2000):
    """Poll ``condition`` (no clock: the state is what the caller asserts)."""
    for _ in range(tries):
        if condition():
            return True
        await asyncio.sleep(0.005)
    return False


async def test_requests_in_flight_decode_together(engine):
    params = {"max_new_tokens": 5000, "ignore_eos": True, "temperature": 1.0}
    calls = [
        asyncio.ensure_future(engine.client.generate(prompt(engine, i), params, lora_path="expert" if i % 2 else None))
        for i in range(8)
    ]
    server = SGLangServer(engine, "tiny", "127.0.0.1", 0)  # its /v1/loads report, read directly
    together = await until(lambda: server.load()["num_running_reqs"] == 8)
    engine.abort(abort_all=True)
    answers = await asyncio.gather(*calls)
    assert together, "the 8 requests never decoded in one batch"
    assert {a["meta_info"]["finish_reason"]["type"] for a in answers} == {"abort"}


async def test_mixed_adapters_in_one_batch_match_a_plain_forward(engine, adapter_dir, reference_log_probs):
    params = {"temperature": 1.0, "max_new_tokens": 10}
    jobs = [(prompt(engine, i), "expert" if i % 3 == 0 else None, {**params, "sampling_seed": i}) for i in range(12)]
    answers = await asyncio.gather(*(engine.client.generate(ids, p, lora_path=lora) for ids, lora, p in jobs))
    for (ids, lora, _), answer in zip(jobs, answers, strict=True):
        out, log_probs = output_tokens(answer)
        expected = reference_log_probs(ids, out, 1.0, adapter_dir if lora else None)
        assert log_probs == pytest.approx(expected, abs=2e-3)


async def test_each_adapters_rows_stay_together_as_requests_join_and_leave(
    engine, adapter_dir, reference_log_probs, tmp_path
):
    from safetensors.torch import load_file, save_file

    other = tmp_path / "other"  # a second adapter: the first with B negated
    other.mkdir()
    (other / "adapter_config.json").write_text((adapter_dir / "adapter_config.json").read_text())
    state = load_file(str(adapter_dir / "adapter_model.safetensors"))
    save_file({k: -v if "lora_B" in k else v for k, v in state.items()}, str(other / "adapter_model.safetensors"))
    await engine.client.load_lora_adapter("other", str(other))
    steps, decode = [], engine.model.forward.decode

    def spy(tokens, lengths, cache, lora):
        steps.append([lora_weights for _, _, lora_weights in lora.segments])
        return decode(tokens, lengths, cache, lora)

    engine.model.forward.decode = spy
    names, dirs = (None, "expert", "other"), (None, adapter_dir, other)
    jobs = [
        (prompt(engine, i), i % 3, {"temperature": 1.0, "sampling_seed": i, "max_new_tokens": 2 + 5 * i % 9})
        for i in range(18)
    ]

    def call(ids, which, params):
        return asyncio.ensure_future(engine.client.generate(ids, params, lora_path=names[which]))

    early = [call(*job) for job in jobs[:9]]
    assert await until(lambda: len(steps) >= 2)
    answers = await asyncio.gather(*early, *(call(*job) for job in jobs[9:]))  # these join rows mid-decode
    assert all(len(set(map(id, segments))) == len(segments) for segments in steps)  # one run per adapter
    assert any(len(segments) == 2 for segments in steps)
    for (ids, which, _), answer in zip(jobs, answers, strict=True):
        out, log_probs = output_tokens(answer)
        assert log_probs == pytest.approx(reference_log_probs(ids, out, 1.0, dirs[which]), abs=2e-3)


async def test_seeded_requests_draw_the_same_tokens_alone_or_among_64(engine):
    def job(i):
        params = {"temperature": 1.0, "top_p": 0.95, "sampling_seed": i, "max_new_tokens": 4 + i % 11}
        return prompt(engine, i), params, "expert" if i % 2 else None  # rows leave the batch at different steps

    crowd = await asyncio.gather(
        *(engine.client.generate(ids, p, lora_path=lora) for ids, p, lora in map(job, range(64)))
    )
    for i in range(0, 64, 9):
        ids, params, lora = job(i)
        alone = output_tokens(await engine.client.generate(ids, params, lora_path=lora))
        assert output_tokens(crowd[i])[0] == alone[0]
        assert output_tokens(crowd[i])[1] == pytest.approx(alone[1], abs=1e-4)
    assert len({tuple(output_tokens(a)[0]) for a in crowd}) > 32  # distinct seeds, distinct draws


def test_draws_follow_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]]).repeat(20000, 1)
    n = logits.shape[0]
    for top_k, top_p, temperature in ((-1, 1.0, 1.0), (2, 1.0, 0.7), (-1, 0.8, 1.0)):
        tokens, log_probs = sample(logits, [temperature] * n, [top_p] * n, [top_k] * n, range(n), [3] * n)
        probs = torch.softmax(logits[0] / temperature, -1)
        kept = 2 if top_k == 2 else int((probs.cumsum(0) - probs < top_p).sum())
        expected = torch.zeros(5)
        expected[:kept] = probs[:kept] / probs[:kept].sum()
        freq = torch.bincount(torch.tensor(tokens), minlength=5).float() / n
        assert freq.tolist() == pytest.approx(expected.tolist(), abs=0.015)
        assert log_probs[0] == pytest.approx(float(torch.log(probs[tokens[0]])), abs=1e-5)


async def test_greedy_batch_equals_one_at_a_time(engine):
    jobs = [(prompt(engine, i), "expert" if i % 2 else None) for i in range(8)]
    params = {"temperature": 0.0, "max_new_tokens": 8}
    alone = [output_tokens(await engine.client.generate(ids, params, lora_path=lora))[0] for ids, lora in jobs]
    together = await asyncio.gather(*(engine.client.generate(ids, params, lora_path=lora) for ids, lora in jobs))
    assert [output_tokens(a)[0] for a in together] == alone


async def test_abort_one_request_leaves_the_others_running(engine):
    long = {"max_new_tokens": 5000, "ignore_eos": True, "temperature": 1.0}
    aborted = asyncio.ensure_future(engine.generate(prompt(engine, 0), SamplingParams(**long), None, rid="gone"))
    short = asyncio.ensure_future(engine.generate(prompt(engine, 1), SamplingParams(max_new_tokens=6), "expert"))
    assert await until(lambda: "gone" in engine.requests)  # the short one may finish before a poll sees both
    engine.abort("gone")
    gone, kept = await aborted, await short
    assert gone.finish["type"] == "abort" and len(gone.output_ids) < 5000
    assert kept.finish["type"] in ("stop", "length") and 1 <= len(kept.output_ids) <= 6


async def test_load_while_decoding_and_unload_waits_for_its_requests(engine, adapter_dir):
    long = SamplingParams(max_new_tokens=5000, ignore_eos=True)
    holder = asyncio.ensure_future(engine.generate(prompt(engine, 0), long, "expert", rid="holder"))
    assert await until(lambda: len(engine.requests) == 1)
    # A load does not wait for the decode: the request is still running when it returns.
    await engine.client.load_lora_adapter("other", str(adapter_dir))
    assert not holder.done()
    unload = asyncio.ensure_future(engine.client.unload_lora_adapter("expert"))
    assert await until(lambda: "expert" not in engine.model.adapters)
    with pytest.raises(SGLangError, match="not loaded"):  # new requests for it are refused at once
        await engine.client.generate(prompt(engine, 1), {"max_new_tokens": 2}, lora_path="expert")
    other = await engine.client.generate(prompt(engine, 1), {"max_new_tokens": 3}, lora_path="other")
    assert len(output_tokens(other)[0]) >= 1
    assert not unload.done() and not holder.done()  # the unload waits for the request holding the adapter
    engine.abort("holder")
    assert (await holder).finish["type"] == "abort"
    await unload
    assert sorted(engine.model.adapters) == ["other"]


async def test_max_running_requests_queues_the_rest(tiny_model_dir):
    model = MultiLoraModel.from_pretrained(tiny_model_dir, settings=EngineSettings(max_running_requests=1))
    eng = LocalEngine(model)
    async with eng.serve():
        long = SamplingParams(max_new_tokens=5000, ignore_eos=True)
        calls = [asyncio.ensure_future(eng.generate(prompt(eng, i), long, None)) for i in range(3)]
        assert await until(lambda: model.num_running == 1 and model.num_waiting == 2)
        eng.abort(abort_all=True)
        assert {r.finish["type"] for r in await asyncio.gather(*calls)} == {"abort"}


def test_engine_settings_are_checked_and_reach_the_stage_config(tmp_path):
    from aclarena_slime.testing.local import LEARNABLE, local_recipe, local_session

    with pytest.raises(LocalConfigError, match="max_running_requests"):
        EngineSettings(max_running_requests=0)
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        local_recipe(tmp_path, *LEARNABLE, "++cluster.local.max_prefill_tokens=-1")
    session = local_session(tmp_path, *LEARNABLE, "++cluster.local.max_running_requests=16")
    assert session.engine.settings == EngineSettings(max_running_requests=16)


def test_an_adapter_the_engine_cannot_reproduce_is_refused(engine_model, adapter_dir, tmp_path):
    dora = tmp_path / "dora"
    dora.mkdir()
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(GenerationError, match="use_dora"):
        engine_model.load_adapter("dora", dora)


def test_a_weight_update_reaches_the_batched_forward(engine_model, tiny_model_dir):
    """The forward's fused q/k/v and gate/up weights are the model's own: an in-place update (the trainer's
    ``LocalEngine.update_weights`` is ``load_state_dict``) changes what the engine computes."""
    from transformers import AutoModelForCausalLM

    from aclarena_slime.local.generation import token_log_probs

    trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p), alpha=0.05)
        engine_model.base.load_state_dict(trained.state_dict())
    ids = engine_model.tokenizer.encode("What is 2 + 2?")
    result = engine_model.submit(ids, SamplingParams(max_new_tokens=6, sampling_seed=3)).future.result(timeout=120)
    with torch.inference_mode():
        logits = trained(input_ids=torch.tensor([ids + result.output_ids])).logits[0, len(ids) - 1 : -1]
    expected = token_log_probs(logits, torch.tensor(result.output_ids), 1.0)
    assert result.log_probs == pytest.approx(expected.tolist(), abs=2e-3)


def test_max_prefill_tokens_counts_real_prompt_tokens(tiny_model_dir):
    """SGLang's prefill budget counts real tokens: a long and a short prompt join even when padded they would not."""
    long, short = list(range(5, 45)), [5, 6]
    model = MultiLoraModel.from_pretrained(
        tiny_model_dir, settings=EngineSettings(max_prefill_tokens=len(long) + len(short))
    )
    rows = []
    prefill = model.forward.prefill

    def counted(ids, *args):
        rows.append(ids.shape[0])
        return prefill(ids, *args)

    model.forward.prefill = counted
    params = SamplingParams(max_new_tokens=2, ignore_eos=True)
    with model._cond:  # all three queued before the worker admits any
        requests = [model.submit(ids, params) for ids in (long, short, short)]
    for request in requests:
        request.future.result()
    assert rows == [2, 1]  # 42 real tokens fit the budget of 42 (80 padded would not); the third waits


def test_prefill_of_prompts_of_many_lengths_matches_a_plain_forward(engine_model):
    """The prefill attends per group of similar length (padded within a group, packed across groups)."""
    forward = engine_model.forward
    prompts = [list(range(7, 7 + n)) for n in (3, 40, 9, 10, 10, 17, 38)]  # groups with and without padding
    ids = torch.zeros(len(prompts), 40, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, : len(p)] = torch.tensor(p)
    cache = forward.new_cache(len(prompts))
    cache.fit(40)
    with torch.inference_mode():
        logits = forward.prefill(
            ids, torch.tensor([len(p) for p in prompts]), cache, torch.arange(len(prompts)), [None] * len(prompts)
        )
        for row, p in enumerate(prompts):
            expected = engine_model.base(input_ids=torch.tensor([p])).logits[0, -1]
            assert torch.allclose(logits[row], expected, atol=1e-4), f"prompt of {len(p)} tokens"
