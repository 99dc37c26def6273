"""RL's Razor's predictor on slime, from a real tiny model and real PEFT adapters.

The current policy's eval samples come from the local engine (SGLang's ``/generate``, the expert adapter
loaded). The starting policy's log-probs of the same tokens come from SGLang's prompt-scoring route
(``max_new_tokens: 0``, ``return_logprob``, ``logprob_start_len``), which the local engine does not serve
(it answers ``max_new_tokens: 0`` with no forward and no ``input_token_logprobs``): :class:`ScoringServer`
speaks that route over a plain transformers + PEFT forward of the same files (SGLang's answer shape:
``[logprob, token_id, text]`` per position from ``logprob_start_len``, the first one ``None``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from aiohttp import web

from aclarena_slime.http_service import serving
from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.generation import MultiLoraModel, token_log_probs
from aclarena_slime.local.tiny_model import save_tiny_checkpoint
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import load_recipe
from aclarena_slime.sglang_client import SGLangClient, output_tokens
from aclarena_slime.slime_edge import monitor as hook
from aclarena_slime.slime_edge.policy_kl import FULL_FT_REASON, KlReference, domain_kl, sampled_kl

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
PROMPTS = ("Add two and three.", "Name a colour.", "Count to four.", "Say hello.")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), with_model=True)


@pytest.fixture(scope="module")
def adapters(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``expert`` (non-zero B: it moves the policy) and ``halfway`` (the same adapter at half its update)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"]),
    )
    out = tmp_path_factory.mktemp("adapters")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
        model.save_pretrained(out / "expert")
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.5)
        model.save_pretrained(out / "halfway")
    return {"expert": out / "expert", "halfway": out / "halfway"}


class ScoringServer:
    """SGLang's prompt scoring (``/generate`` with ``max_new_tokens: 0``) over transformers + PEFT."""

    def __init__(self, model_dir: Path, adapters: dict[str, Path]) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        (first, path), *rest = adapters.items()
        self.model = PeftModel.from_pretrained(base, str(path), adapter_name=first).eval()
        for name, path in rest:
            self.model.load_adapter(str(path), adapter_name=name)
        self.requests: list[dict] = []

    async def generate(self, request: web.Request) -> web.Response:
        payload = await request.json()
        self.requests.append(payload)
        params = payload["sampling_params"]
        if params.get("max_new_tokens") != 0 or not payload.get("return_logprob"):
            return web.json_response({"error": {"message": "this stand-in only scores prompts"}}, status=400)
        ids, start, lora = payload["input_ids"], int(payload["logprob_start_len"]), payload.get("lora_path")
        with torch.inference_mode():
            if lora is None:
                with self.model.disable_adapter():
                    logits = self.model(input_ids=torch.tensor([ids])).logits[0]
            else:
                self.model.set_adapter(lora)
                logits = self.model(input_ids=torch.tensor([ids])).logits[0]
        scored = token_log_probs(logits[:-1], torch.tensor(ids[1:]), float(params.get("temperature", 1.0))).tolist()
        entries = [[None if pos == 0 else scored[pos - 1], ids[pos], None] for pos in range(start, len(ids))]
        meta = {"input_token_logprobs": entries, "prompt_tokens": len(ids), "completion_tokens": 0}
        return web.json_response({"text": "", "output_ids": [], "meta_info": meta})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        return app


@contextlib.asynccontextmanager
async def _eval_samples(model_dir: Path, adapter: Path, temperature: float):
    """Eval samples of the current policy (the adapter), as slime's eval hands them over: tokens, response length,
    the engine's log-probs, the loss mask."""
    engine = LocalEngine(MultiLoraModel.from_pretrained(model_dir, seed=0), served_name="tiny")
    async with engine.serve() as url:
        client = SGLangClient(url)
        await client.load_lora_adapter("expert", str(adapter))
        samples = []
        for seed, text in enumerate(PROMPTS):
            prompt = engine.chat.prompt_ids([{"role": "user", "content": text}])
            params = {"temperature": temperature, "max_new_tokens": 16, "sampling_seed": seed, "ignore_eos": True}
            out, log_probs = output_tokens(await client.generate(prompt, params, lora_path="expert"))
            samples.append(
                SimpleNamespace(
                    tokens=prompt + out, response_length=len(out), rollout_log_probs=log_probs, loss_mask=[1] * len(out)
                )
            )
        yield samples


@pytest.mark.slow  # a tiny model served twice, a few PEFT forwards
async def test_the_kl_estimate_is_zero_for_the_same_policy_and_grows_with_the_difference(model_dir, adapters):
    scorer = ScoringServer(model_dir, adapters)
    async with _eval_samples(model_dir, adapters["expert"], 0.8) as samples, serving(scorer.app()) as url:
        kl = {
            name: await asyncio.to_thread(domain_kl, url, KlReference(lora), samples, 0.8)
            for name, lora in (("same", "expert"), ("halfway", "halfway"), ("base", None))
        }
    assert kl["same"] == pytest.approx(0.0, abs=1e-6)  # the engine's and the scorer's numerics agree
    assert kl["same"] < kl["halfway"] < kl["base"] and kl["base"] > 1e-2
    request = scorer.requests[-1]  # the base: no lora_path, scored at the samples' temperature, from the response
    sample = samples[-1]
    assert "lora_path" not in request and request["input_ids"] == sample.tokens
    assert request["sampling_params"]["max_new_tokens"] == 0 and request["sampling_params"]["temperature"] == 0.8
    assert request["logprob_start_len"] == len(sample.tokens) - sample.response_length - 1


def _section(tmp_path: Path, recipe: str) -> dict:
    suite = tmp_path / "watch.yaml"
    suite.write_text("name: watch\ndatasets:\n  gsm: {env: math, path: /data/math/gsm.jsonl, temperature: 0.8}\n")
    overrides = ["++monitor.enabled=true", "++monitor.domains=[math]", f"++monitor.suite={suite}"]
    recipe_ = load_recipe(RECIPES / recipe, [f"paths.root={tmp_path}", *overrides])
    return compile_recipe(recipe_).custom_config["aclarena_monitor"]


@pytest.mark.slow
async def test_the_compiled_lora_monitor_records_the_kl_beside_the_scores(tmp_path: Path, model_dir, adapters):
    section = _section(tmp_path, "mle_search.yaml")
    assert section["kl_reference"] == {"lora_path": None}  # the adapter starts from the base the engine serves
    assert section["temperatures"] == {"gsm": 0.8}
    scorer = ScoringServer(model_dir, adapters)
    async with _eval_samples(model_dir, adapters["expert"], 0.8) as samples, serving(scorer.app()) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        args = SimpleNamespace(
            aclarena_monitor=section, skip_eval_before_train=False, sglang_router_ip=host, sglang_router_port=int(port)
        )
        data = {"gsm": {"rewards": [1.0, 0.0, 1.0, 1.0], "truncated": [False] * 4, "samples": samples}}
        assert await asyncio.to_thread(hook.log_eval, 0, args, data, None) is False
    report = json.loads((Path(section["out_dir"]) / "monitor.json").read_text())
    [[step, value]] = report["kl"]["math"]
    assert step == 0 and value > 1e-2 and report["curves"]["math"] == [[0, 75.0]]
    assert len(scorer.requests) == len(samples)


def test_full_fine_tuning_says_the_kl_is_not_computed(tmp_path: Path, capsys):
    section = _section(tmp_path, "stage2_search.yaml")
    assert section["kl_reference"] is None
    args = SimpleNamespace(aclarena_monitor=section, skip_eval_before_train=False)  # no engine is asked
    hook.log_eval(0, args, {"gsm": {"rewards": [1.0], "truncated": [False]}}, None)
    assert FULL_FT_REASON in capsys.readouterr().err
    assert json.loads((Path(section["out_dir"]) / "monitor.json").read_text())["kl_note"] == FULL_FT_REASON


def test_the_estimator_counts_only_the_models_tokens_and_refuses_ragged_input():
    current, start = [[-1.0, -2.0, -0.5]], [[-1.0, -9.0, -1.5]]
    expected = math.expm1(-1.0) + 1.0  # only the last token: delta -1; the observation token is masked
    assert sampled_kl(current, start, [[1, 0, 1]]) == pytest.approx(expected / 2)
    assert math.isnan(sampled_kl(current, start, [[0, 0, 0]]))
    with pytest.raises(ValueError, match="sample 0"):
        sampled_kl([[-1.0]], [[-1.0, -2.0]], [[1]])
