"""The LoRA weight updater builds the adapter from slime's CPU copy, never from the live parameters.

With ``--colocate`` slime pauses the trainer's GPU memory (torch_memory_saver) right after init and
calls ``update_weights`` while it sleeps: the live tensors are unmapped then. Here the live adapter
parameters are poisoned (NaN, or moved to the meta device) after the copy is taken; the adapter that
reaches the (fake) SGLang server must equal the copy.
"""

from __future__ import annotations

import asyncio
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from aclarena_slime.lora import LoraConfig, inject_lora
from aclarena_slime.lora.export import AttentionShape, gather_adapter, to_peft_state_dict
from aclarena_slime.lora.layers import lora_modules, randomize_adapters
from aclarena_slime.slime_edge.lora_updater import LoraWeightUpdater
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.loops import background_loop

RANK = 4


def _args(sync_dir) -> SimpleNamespace:
    lora = {"rank": RANK, "alpha": 8, "adapter_name": "expert", "sync_dir": str(sync_dir)}
    return SimpleNamespace(aclarena_lora=lora, hf_checkpoint=None, num_experts=None)


def _poison(model, how: str) -> None:
    for module in lora_modules(model):
        for name in ("lora_A", "lora_B"):
            linear = getattr(module, name)
            if how == "nan":
                linear.weight.data.fill_(float("nan"))
            else:  # no storage at all, like memory torch_memory_saver has unmapped
                linear.weight = torch.nn.Parameter(torch.empty_like(linear.weight, device="meta"))


def _sync_through_fake_engine(updater: LoraWeightUpdater, sync_dir) -> dict[str, torch.Tensor]:
    """Run ``update_weights`` against a fake SGLang server; return the adapter the server was told to load."""
    with background_loop() as loop:
        engine = FakeSGLang(None, [])
        asyncio.run_coroutine_threadsafe(engine.start(), loop).result(30)
        try:
            updater.connect_rollout_engines([engine])
            updater._engine_urls = lambda: [engine.url]  # slime asks its Ray engine actors; none here
            updater.update_weights()
        finally:
            asyncio.run_coroutine_threadsafe(engine._shut(), loop).result(30)
    assert engine.adapters == {"expert": str(sync_dir / "expert")} and engine.pause_modes == ["abort"]
    return load_file(str(sync_dir / "expert" / "adapter_model.safetensors"))


def _expected(model) -> dict[str, torch.Tensor]:
    return to_peft_state_dict(gather_adapter(model), AttentionShape.from_megatron(model.config))


@pytest.fixture
def no_slime_barrier(monkeypatch):
    """slime's gloo group is set up by slime's own init; the test's default gloo group stands in."""
    module = types.ModuleType("slime.utils.distributed_utils")
    module.get_gloo_group = lambda: None
    for name in ("slime", "slime.utils"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "slime.utils.distributed_utils", module)


@pytest.mark.parametrize("poison", ["nan", "meta"])
def test_adapter_comes_from_the_weights_copy(tiny_model, tmp_path, no_slime_barrier, poison):
    inject_lora(tiny_model, LoraConfig(rank=RANK, alpha=8))
    randomize_adapters(tiny_model, seed=7, std=0.1)
    expected = _expected(tiny_model)
    # The names slime's named_params_and_buffers(convert_to_global_name=True) gives at PP=1, no DDP wrapper.
    copy = {f"module.{n}": p.detach().clone() for n, p in tiny_model.named_parameters()}
    updater = LoraWeightUpdater(_args(tmp_path), [tiny_model], weights_getter=lambda: copy)
    _poison(tiny_model, poison)
    synced = _sync_through_fake_engine(updater, tmp_path)
    assert synced.keys() == expected.keys()
    assert all(torch.equal(synced[k], v) for k, v in expected.items())


def test_a_copy_without_the_adapter_is_refused(tiny_model, tmp_path):
    inject_lora(tiny_model, LoraConfig(rank=RANK, alpha=8))
    copy = {f"module.{n}": p.detach() for n, p in tiny_model.named_parameters() if ".lora_" not in n}
    updater = LoraWeightUpdater(_args(tmp_path), [tiny_model], weights_getter=lambda: copy)
    with pytest.raises(KeyError, match="lora_A"):
        updater.adapter_tensors()


@pytest.mark.slime
def test_adapter_comes_from_slimes_tensor_backuper(tiny_model, tmp_path, monkeypatch, no_slime_barrier):
    """slime's own TensorBackuper and global names, as its actor wires ``weights_getter``."""
    from slime.backends.megatron_utils.update_weight.common import named_params_and_buffers
    from slime.utils import accelerator
    from slime.utils.tensor_backper import TensorBackuper

    real_empty_like = torch.empty_like
    # CPU stand-ins: the backup pins its copy (no pinned-memory allocator without CUDA) and then waits
    # for the device (nothing to wait for on CPU).
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: real_empty_like(t, **{**kw, "pin_memory": False}))
    monkeypatch.setattr(accelerator, "synchronize", lambda: None)
    inject_lora(tiny_model, LoraConfig(rank=RANK, alpha=8))
    randomize_adapters(tiny_model, seed=11, std=0.1)
    args = _args(tmp_path)
    backuper = TensorBackuper.create(
        source_getter=lambda: named_params_and_buffers(args, [tiny_model], convert_to_global_name=True),
        single_tag=None,
    )
    backuper.backup("actor")
    expected = _expected(tiny_model)
    updater = LoraWeightUpdater(args, [tiny_model], weights_getter=lambda: backuper.get("actor"))
    _poison(tiny_model, "meta")
    synced = _sync_through_fake_engine(updater, tmp_path)
    assert synced.keys() == expected.keys()
    assert all(torch.equal(synced[k], v) for k, v in expected.items())


def test_parallel_experts_sync_one_adapter_each(tiny_model, tmp_path, no_slime_barrier):
    """Stacked experts (parallel MLE): one PEFT folder per expert, each its own block of the stacked matrices."""
    from aclarena_slime.lora.layers import select_expert

    experts = ["math", "search"]
    inject_lora(tiny_model, LoraConfig(rank=RANK, alpha=8, experts=experts))
    randomize_adapters(tiny_model, seed=5, std=0.1)
    stacked = gather_adapter(tiny_model)
    copy = {f"module.{n}": p.detach().clone() for n, p in tiny_model.named_parameters()}
    args = _args(tmp_path)
    args.aclarena_lora = {**args.aclarena_lora, "experts": experts}
    updater = LoraWeightUpdater(args, [tiny_model], weights_getter=lambda: copy)
    with background_loop() as loop:
        engine = FakeSGLang(None, [])
        asyncio.run_coroutine_threadsafe(engine.start(), loop).result(30)
        try:
            updater.connect_rollout_engines([engine])
            updater._engine_urls = lambda: [engine.url]
            updater.update_weights()
        finally:
            asyncio.run_coroutine_threadsafe(engine._shut(), loop).result(30)
    assert engine.adapters == {tag: str(tmp_path / tag) for tag in experts}
    shape = AttentionShape.from_megatron(tiny_model.config)
    for k, tag in enumerate(experts):
        synced = load_file(str(tmp_path / tag / "adapter_model.safetensors"))
        expected = to_peft_state_dict(select_expert(stacked, k, RANK), shape)
        assert synced.keys() == expected.keys()
        assert all(torch.equal(synced[key], v) for key, v in expected.items())
        assert all(v.shape[0] == RANK for key, v in synced.items() if "lora_A" in key)
    assert updater.pop_metrics()["perf/lora_sync_bytes"] > 0
