"""Stacked LoRA experts in megatron-core layers (parallel MLE): each token uses its sample's adapter, a
sample's gradient reaches only that adapter, and TP=2 (two gloo processes) equals TP=1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aclarena_slime.lora import LoraConfig, inject_lora
from aclarena_slime.lora.config import LoraConfigError
from aclarena_slime.lora.layers import set_adapter_index
from aclarena_slime.lora.selftest import build_tiny_gpt, free_port, megatron_logits, model_parallel

pytestmark = pytest.mark.slow  # two processes: ~30 s on 2 cores

WORKER = Path(__file__).with_name("multi_worker.py")
sys.path.insert(0, str(WORKER.parent))
import multi_worker  # noqa: E402

RANK = multi_worker.CONFIG.rank


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("multi")
    with model_parallel():
        model = build_tiny_gpt(multi_worker.SHAPE, seed=0)
        full = {k: v.detach().clone() for k, v in model.named_parameters()}
        torch.save(full, workdir / "backbone.pt")
        tp1 = multi_worker.multi_run(full, 0, 1)
    port = str(free_port())
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(r), "2", port, str(workdir)], stderr=subprocess.PIPE)
        for r in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err.decode()[-3000:]
    return tp1, [torch.load(workdir / f"multi_rank{r}.pt") for r in range(2)]


def _block(key: str, tensor: torch.Tensor, k: int) -> torch.Tensor:
    rows = slice(k * RANK, (k + 1) * RANK)
    return tensor[rows] if key.endswith("lora_A") else tensor[:, rows]


def test_each_sample_runs_its_own_expert(runs):
    """In one mixed batch, sample k's logits are those of a one-adapter model holding expert k."""
    tp1, ranks = runs
    for result in [tp1, *ranks]:
        for k, tag in enumerate(multi_worker.EXPERTS):
            torch.testing.assert_close(result["logits"][k], result["alone"][tag][k], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(tp1["alone"]["math"][1], tp1["alone"]["search"][1], atol=1e-3)  # experts differ


def test_a_samples_gradient_reaches_only_its_expert(runs):
    """The math sample's loss: every search block's gradient is exactly zero, the math blocks' are not."""
    tp1, ranks = runs
    for result in [tp1, *ranks]:
        grads = result["grads_math_sample"]
        assert all(torch.count_nonzero(_block(key, g, 1)) == 0 for key, g in grads.items())
        assert all(torch.count_nonzero(_block(key, g, 0)) > 0 for key, g in grads.items())
        assert all(torch.count_nonzero(_block(key, g, 1)) > 0 for key, g in result["grads_both"].items())


def test_tp2_gradients_and_step_equal_tp1(runs):
    tp1, ranks = runs
    for result in ranks:
        for which in ("grads_math_sample", "grads_both"):
            for key, tensor in tp1[which].items():
                torch.testing.assert_close(result[which][key], tensor, atol=1e-5, rtol=1e-4, msg=key)
        for tag, expert in tp1["after"].items():
            for key, tensor in expert.items():
                torch.testing.assert_close(result["after"][tag][key], tensor, atol=1e-6, rtol=1e-5, msg=key)


def test_stacked_adapters_need_an_index():
    with model_parallel():
        model = build_tiny_gpt(multi_worker.SHAPE, seed=0)
        inject_lora(model, multi_worker.CONFIG)
        ids = multi_worker.IDS
        with pytest.raises(LoraConfigError, match="no adapter index"):
            megatron_logits(model, ids)
        with pytest.raises(ValueError, match="out of range"):
            set_adapter_index(model, torch.full((12, 2), 2))


def test_expert_names_are_checked():
    with pytest.raises(LoraConfigError, match="distinct"):
        LoraConfig(experts=["math", "math"])
    assert LoraConfig(experts=["math", "search"]).adapter_index("search") == 1
    with pytest.raises(LoraConfigError, match="no parallel-MLE expert"):
        LoraConfig(experts=["math"]).adapter_index("retail")
