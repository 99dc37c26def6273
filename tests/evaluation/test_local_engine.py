"""With the local backend: the tiny model with two PEFT experts; each domain is routed to its expert."""

from __future__ import annotations

import json

import pytest
import torch

from aclarena_slime.evaluation import RunSettings, load_experts, parse_suite, run_suite
from aclarena_slime.experts import ExpertTable
from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.generation import MultiLoraModel
from aclarena_slime.local.tiny_model import save_tiny_checkpoint
from aclarena_slime.sglang_client import SGLangClient, output_tokens

GREEDY = {"temperature": 0.0, "top_p": 1.0}


@pytest.fixture
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model decodes fastest on one thread, and CI shares its cores
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), with_model=True)


def _expert(model_dir, out, seed):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"]),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.save_pretrained(out)


async def test_each_domain_is_answered_by_its_expert(model_dir, tmp_path, one_thread):
    root = tmp_path / "run"
    _expert(model_dir, root / "experts" / "math", seed=1)
    _expert(model_dir, root / "experts" / "mock", seed=2)
    manifest = {
        "version": 1,
        "base": {"name": "tiny", "path": str(model_dir)},
        "experts": {
            "math": {"adapter": "math-expert", "path": "experts/math", "stage": "stage1_math"},
            "mock": {"adapter": "mock-expert", "path": "experts/mock", "stage": "stage2_mock"},
        },
    }
    (root / "experts.json").write_text(json.dumps(manifest))
    (root / "math.jsonl").write_text(json.dumps({"prompt": "What is 2 + 2?", "label": "4"}) + "\n")
    (root / "mock.jsonl").write_text(json.dumps({"prompt": "", "label": "pear"}) + "\n")
    suite = parse_suite(
        {
            "defaults": {**GREEDY, "max_response_len": 12},
            "datasets": {
                "arith": {"env": "math", "path": "math.jsonl", "env_config": {"workers": 1}},
                "guess": {"env": "mock", "path": "mock.jsonl", "max_turns": 1},
            },
        }
    )
    experts = ExpertTable.load(root / "experts.json")
    engine = LocalEngine(MultiLoraModel.from_pretrained(model_dir, seed=0), served_name="tiny")
    async with engine.serve() as url:
        client = SGLangClient(url)
        assert sorted(await load_experts(client, experts)) == ["math-expert", "mock-expert"]
        summary = await run_suite(suite, client, engine.model.tokenizer, RunSettings(root / "out", root), experts)
        lines = {
            name: json.loads((root / "out" / "samples" / f"{name}.jsonl").read_text().splitlines()[0])
            for name in ("arith", "guess")
        }
        # The same prompt, greedily, under each adapter and the base: only the routed one reproduces the eval.
        answers = {}
        for name, line in lines.items():
            for adapter in (None, "math-expert", "mock-expert"):
                params = {**GREEDY, "max_new_tokens": line["response_tokens"]}
                out = await client.generate(line["prompt_ids"], params, lora_path=adapter)
                answers[name, adapter] = output_tokens(out)[0]
    assert summary["datasets"]["arith"]["lora_path"] == "math-expert"
    assert summary["datasets"]["guess"]["lora_path"] == "mock-expert"
    assert set(summary["domains"]) == {"math", "mock"}
    assert summary["datasets"]["arith"]["n_scored"] + summary["datasets"]["arith"]["n_unscored"] == 1
    for name, routed in (("arith", "math-expert"), ("guess", "mock-expert")):
        assert lines[name]["response_ids"] == answers[name, routed]
        others = {a for a in (None, "math-expert", "mock-expert") if a != routed}
        assert all(answers[name, a] != answers[name, routed] for a in others), "adapters must answer differently"


def test_cli_serves_a_local_model_and_loads_the_manifest_experts(model_dir, tmp_path, one_thread, capsys):
    from aclarena_slime.cli import main

    _expert(model_dir, tmp_path / "experts" / "mock", seed=2)
    (tmp_path / "experts.json").write_text(json.dumps({"experts": {"mock": {"adapter": "m", "path": "experts/mock"}}}))
    (tmp_path / "mock.jsonl").write_text(json.dumps({"prompt": "", "label": "pear"}) + "\n")
    (tmp_path / "suite.yaml").write_text("datasets:\n  guess: {env: mock, path: mock.jsonl, max_response_len: 8}\n")
    argv = ["eval", "run", str(tmp_path / "suite.yaml"), "--local-model", str(model_dir), "--json"]
    argv += ["--experts", str(tmp_path / "experts.json"), "--out", str(tmp_path / "out"), "--data-root", str(tmp_path)]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["datasets"]["guess"]["lora_path"] == "m" and summary["datasets"]["guess"]["n_unscored"] == 0
    assert summary["model"]["endpoint"] == f"local:{model_dir}"
