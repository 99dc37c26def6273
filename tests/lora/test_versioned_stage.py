"""A versioned (asynchronous) LoRA stage ends with its expert under the plain name (issue 44, section 4).

``recipes/mle_retail_async.yaml`` syncs ``retail@N`` every step; the stage's adapter check
(``launcher/stage.py``) and the monitor's ``keep`` read ``<sync_dir>/retail``. Before the sync published
the current version there, the stage trained to the end and then failed ("left no adapter").
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from aclarena_slime.adapter_swap import AdapterLedger, adapter_checksum
from aclarena_slime.launcher.stage import StageResult, _check_adapter
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import load_recipe
from aclarena_slime.slime_edge.lora_updater import LoraWeightUpdater
from aclarena_slime.testing.fake_sglang import FakeSGLang

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "mle_retail_async.yaml"
KEY = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"


async def test_a_versioned_stage_ends_ok_with_its_expert_under_the_plain_name(tmp_path):
    command = compile_recipe(load_recipe(RECIPE, [f"paths.root={tmp_path}", "cluster=paper_2x8"]))
    lora = command.custom_config["aclarena_lora"]
    assert lora["staleness_budget"] == 1 and lora["sync_mode"] == "disk"
    updater = LoraWeightUpdater(SimpleNamespace(aclarena_lora=lora, hf_checkpoint=None, num_experts=None), [], dict)
    name = lora["adapter_name"]
    rank = updater.config.rank
    async with FakeSGLang(None, []) as engine:
        for step in range(3):  # what update_weights does on rank 0 after each train step
            tensors = {KEY.format("A"): torch.full((rank, 8), 0.1), KEY.format("B"): torch.full((8, rank), step + 1.0)}
            result = await updater._sync([engine.url], name, tensors)
    assert result.served == f"{name}@2" and sorted(engine.adapters) == [f"{name}@1", f"{name}@2"]
    stage = StageResult(0, "slime")
    _check_adapter(stage, lora)
    assert (stage.status, stage.message) == (0, None)
    assert stage.adapter == f"{lora['sync_dir']}/{name}"
    assert adapter_checksum(stage.adapter) == AdapterLedger(lora["sync_dir"]).read()[name]["checksum"]


async def test_the_monitor_keeps_the_current_version_of_a_versioned_stage(tmp_path):
    """The eval hook's ``keep`` copies ``<sync_dir>/<name>`` (the compiled policy_dir): with versioned syncs
    it must find the current version there instead of raising inside slime's eval."""
    from aclarena_slime.slime_edge import monitor as hook

    suite = tmp_path / "watch.yaml"
    suite.write_text("name: watch\ndatasets:\n  gsm: {env: math, path: /data/math/gsm.jsonl}\n")
    watch = ["++monitor.enabled=true", "++monitor.domains=[math]", f"++monitor.suite={suite}", "++monitor.action=keep"]
    command = compile_recipe(load_recipe(RECIPE, [f"paths.root={tmp_path}", "cluster=paper_2x8", *watch]))
    lora, section = command.custom_config["aclarena_lora"], command.custom_config["aclarena_monitor"]
    updater = LoraWeightUpdater(SimpleNamespace(aclarena_lora=lora, hf_checkpoint=None, num_experts=None), [], dict)
    rank = updater.config.rank
    tensors = {KEY.format("A"): torch.full((rank, 8), 0.1), KEY.format("B"): torch.full((8, rank), 1.0)}
    async with FakeSGLang(None, []) as engine:
        await updater._sync([engine.url], lora["adapter_name"], tensors)
    args = SimpleNamespace(aclarena_monitor=section, skip_eval_before_train=False, sglang_router_ip="::1",
                           sglang_router_port=1)  # fmt: skip
    results = {"gsm": {"rewards": [1.0, 0.0], "truncated": [False, False]}}
    assert hook.log_eval(0, args, results, None) is False
    kept = Path(section["out_dir"]) / "kept_adapter"
    assert adapter_checksum(kept) == adapter_checksum(section["policy_dir"])
