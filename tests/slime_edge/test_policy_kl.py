"""RL's Razor's predictor on slime, from a real tiny model and real PEFT adapters, all served by the local engine.

The current policy's eval samples come from the engine (SGLang's ``/generate``, the expert adapter). The starting
policy's log-probs of the same tokens come from the same engine through SGLang's prompt-scoring route
(``max_new_tokens: 0``, ``return_logprob``, ``logprob_start_len``), as on slime: the engine served as
``aclarena local serve-engine`` serves it (:class:`SGLangServer`), with ``expert`` and ``halfway`` loaded.
A plain transformers + PEFT forward of the same files is the reference the KL is checked against.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aclarena_slime.http_service import serving
from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.generation import MultiLoraModel, token_log_probs
from aclarena_slime.local.sglang_server import SGLangServer
from aclarena_slime.local.tiny_model import save_tiny_checkpoint
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import load_recipe
from aclarena_slime.sglang_client import SGLangClient, output_tokens
from aclarena_slime.slime_edge import monitor as hook
from aclarena_slime.slime_edge.policy_kl import FULL_FT_REASON, KlReference, domain_kl, sampled_kl

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
PROMPTS = ("Add two and three.", "Name a colour.", "Count to four.", "Say hello.")
TEMPERATURE = 0.8


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


@contextlib.asynccontextmanager
async def _served_with_eval_samples(model_dir: Path, adapters: dict[str, Path]):
    """The engine as serve-engine serves it (both adapters loaded), and the current policy's (the expert's) eval
    samples as slime's eval hands them over: tokens, response length, the engine's log-probs, the loss mask."""
    engine = LocalEngine(MultiLoraModel.from_pretrained(model_dir, seed=0), served_name="tiny")
    for name, path in adapters.items():
        engine.model.load_adapter(name, path)
    server = SGLangServer(engine, model_dir, "127.0.0.1", 0, log=io.StringIO())
    async with serving(server.app()) as url:
        client = SGLangClient(url)
        samples = []
        for seed, text in enumerate(PROMPTS):
            prompt = engine.chat.prompt_ids([{"role": "user", "content": text}])
            params = {"temperature": TEMPERATURE, "max_new_tokens": 16, "sampling_seed": seed, "ignore_eos": True}
            out, log_probs = output_tokens(await client.generate(prompt, params, lora_path="expert"))
            samples.append(
                SimpleNamespace(
                    tokens=prompt + out, response_length=len(out), rollout_log_probs=log_probs, loss_mask=[1] * len(out)
                )
            )
        yield server, url, samples
    await asyncio.to_thread(engine.model.wait_idle)


def _plain_log_probs(model_dir: Path, adapter: Path | None, samples: list) -> list[list[float]]:
    """Each sample's response log-probs from one plain transformers (+ PEFT) forward of the whole sequence."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = (PeftModel.from_pretrained(model, str(adapter)) if adapter else model).eval()
    out = []
    with torch.inference_mode():
        for s in samples:
            start = len(s.tokens) - s.response_length
            logits = model(input_ids=torch.tensor([s.tokens])).logits[0, start - 1 : -1]
            out.append(token_log_probs(logits, torch.tensor(s.tokens[start:]), TEMPERATURE).tolist())
    return out


@pytest.mark.slow  # a tiny model served once, three scorings of four samples, two plain forwards
async def test_the_kl_estimate_is_zero_for_the_same_policy_and_grows_with_the_difference(model_dir, adapters):
    async with _served_with_eval_samples(model_dir, adapters) as (server, url, samples):
        kl = {
            name: await asyncio.to_thread(domain_kl, url, KlReference(lora), samples, TEMPERATURE)
            for name, lora in (("same", "expert"), ("halfway", "halfway"), ("base", None))
        }
    assert server.calls["POST /generate"] == len(samples) * 4  # the samples, then three scorings of each
    assert kl["same"] == pytest.approx(0.0, abs=1e-6)  # the engine scores its own samples as it sampled them
    assert kl["same"] < kl["halfway"] < kl["base"] and kl["base"] > 1e-2
    masks = [s.loss_mask for s in samples]
    current = [s.rollout_log_probs for s in samples]
    for name, adapter in (("halfway", adapters["halfway"]), ("base", None)):
        expected = sampled_kl(current, _plain_log_probs(model_dir, adapter, samples), masks)
        assert kl[name] == pytest.approx(expected, rel=1e-3), name


def _section(tmp_path: Path, recipe: str) -> dict:
    suite = tmp_path / "watch.yaml"
    suite.write_text("name: watch\ndatasets:\n  gsm: {env: math, path: /data/math/gsm.jsonl, temperature: 0.8}\n")
    overrides = ["++monitor.enabled=true", "++monitor.domains=[math]", f"++monitor.suite={suite}"]
    recipe_ = load_recipe(RECIPES / recipe, [f"paths.root={tmp_path}", *overrides])
    return compile_recipe(recipe_).custom_config["aclarena_monitor"]


async def test_the_compiled_lora_monitor_records_the_kl_beside_the_scores(tmp_path: Path, model_dir, adapters):
    section = _section(tmp_path, "mle_search.yaml")
    assert section["kl_reference"] == {"lora_path": None}  # the adapter starts from the base the engine serves
    assert section["temperatures"] == {"gsm": TEMPERATURE}
    async with _served_with_eval_samples(model_dir, adapters) as (server, url, samples):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        args = SimpleNamespace(
            aclarena_monitor=section, skip_eval_before_train=False, sglang_router_ip=host, sglang_router_port=int(port)
        )
        data = {"gsm": {"rewards": [1.0, 0.0, 1.0, 1.0], "truncated": [False] * 4, "samples": samples}}
        assert await asyncio.to_thread(hook.log_eval, 0, args, data, None) is False
    report = json.loads((Path(section["out_dir"]) / "monitor.json").read_text())
    [[step, value]] = report["kl"]["math"]
    assert step == 0 and value > 1e-2 and report["curves"]["math"] == [[0, 75.0]]
    assert server.calls["POST /generate"] == len(samples) * 2  # one scoring per sample


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
