"""The slime hooks, against stand-ins for the slime modules they touch (slime is not installed here)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from aclarena_slime.lora import LoraConfigError
from aclarena_slime.lora.config import ADAPTER_PARAM_PATTERN
from aclarena_slime.lora.layers import lora_modules
from aclarena_slime.lora.selftest import build_tiny_gpt
from aclarena_slime.slime_edge import lora as provider_module
from aclarena_slime.slime_edge.lora_updater import LoraWeightUpdater


def _args(lora: dict | None = None, **extra):
    settings = {"rank": 4, "alpha": 8, "sync_dir": "/shared/run/adapters", **(lora or {})}
    return SimpleNamespace(aclarena_lora=settings, only_train_params_name_list=None, **extra)


@pytest.fixture
def fake_slime(monkeypatch):
    """Modules named like slime's with the attributes the hooks use."""

    class Actor:
        def __init__(self, model):
            self.model, self.tag = model, None

        def _switch_model(self, tag):
            self.tag = tag

    actor = types.ModuleType("slime.backends.megatron_utils.actor")
    actor.MegatronTrainRayActor = Actor
    actor.UpdateWeightFromTensor = actor.UpdateWeightFromDistributed = actor.UpdateWeightFromDisk = object
    model_provider = types.ModuleType("slime.backends.megatron_utils.model_provider")
    model = types.ModuleType(
        "slime.backends.megatron_utils.model"
    )  # Megatron's checkpoint functions, as imported there
    model.backbone_loads = []
    model.save_checkpoint = lambda *args, **kwargs: pytest.fail("the whole model must not be saved")
    model.load_checkpoint = lambda *args, **kwargs: model.backbone_loads.append(args) or (0, 0)
    training = types.ModuleType("megatron.training")
    for name in ("slime", "slime.backends", "slime.backends.megatron_utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "slime.backends.megatron_utils.actor", actor)
    monkeypatch.setitem(sys.modules, "slime.backends.megatron_utils.model_provider", model_provider)
    monkeypatch.setitem(sys.modules, "slime.backends.megatron_utils.model", model)
    monkeypatch.setitem(sys.modules, "megatron.training", training)
    sys.modules["slime.backends.megatron_utils"].actor = actor
    sys.modules["slime.backends.megatron_utils"].model = model
    return SimpleNamespace(actor=actor, model_provider=model_provider, training=training, model=model)


def test_check_args_fills_the_trainable_list():
    args = _args()
    provider_module.check_args(args)
    assert args.only_train_params_name_list == [ADAPTER_PARAM_PATTERN]


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"sequence_parallel": True}, "sequence-parallel"),
        ({"save_hf": "/ckpt/hf"}, "save-hf"),
        ({"update_weight_transport": "disk"}, "sync_mode"),
        ({"lora": {"sync_dir": None}}, "sync_dir"),  # disk sync (the default) would fail at the first step
    ],
)
def test_check_args_refuses_what_cannot_work(extra, message):
    with pytest.raises(LoraConfigError, match=message):
        provider_module.check_args(_args(**extra))


def test_check_args_refuses_a_trainable_list_that_unfreezes_the_backbone():
    args = _args()
    args.only_train_params_name_list = ["linear_qkv"]
    with pytest.raises(LoraConfigError, match="nothing else"):
        provider_module.check_args(args)


def test_init_hook_turns_adapters_off_for_the_reference(fake_slime, tiny_model):
    from aclarena_slime.lora import LoraConfig, inject_lora

    provider_module.megatron_init(_args())
    assert fake_slime.actor.UpdateWeightFromTensor is LoraWeightUpdater
    assert fake_slime.actor.UpdateWeightFromDistributed is LoraWeightUpdater
    inject_lora(tiny_model, LoraConfig(rank=2, alpha=2))
    actor = fake_slime.actor.MegatronTrainRayActor([tiny_model])
    actor._switch_model("ref")
    assert actor.tag == "ref" and not any(m.lora_enabled for m in lora_modules(tiny_model))
    actor._switch_model("actor")
    assert all(m.lora_enabled for m in lora_modules(tiny_model))
    provider_module.megatron_init(_args())  # idempotent: the switch is wrapped once
    actor._switch_model("ref")
    assert actor.tag == "ref"


def test_model_provider_wraps_slimes_default_model(fake_slime, tp1, tiny_shape):
    args = _args(custom_model_provider_path="aclarena_slime.slime_edge.lora.model_provider")
    seen = {}

    def default_provider_factory(base_args, role):
        seen["path"], seen["role"] = base_args.custom_model_provider_path, role
        return lambda pre_process, post_process, vp_stage: build_tiny_gpt(tiny_shape)

    fake_slime.training.get_args = lambda: args
    fake_slime.model_provider._get_model_provider_func = default_provider_factory
    model = provider_module.model_provider(pre_process=True, post_process=True)
    assert seen == {"path": None, "role": "actor"}
    assert args.custom_model_provider_path  # the user's args are untouched
    assert len(list(lora_modules(model))) == 4 * tiny_shape.num_layers
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".lora_" in n
    }


def test_init_hook_saves_and_resumes_the_adapter_only(fake_slime, tp1, tiny_shape, tmp_path):
    """slime's save(...) -> save_checkpoint(iteration, model, optimizer, scheduler, **megatron_kwargs);
    initialize_model_and_optimizer -> load_checkpoint(model, optimizer, scheduler, context, skip)."""
    from aclarena_slime.lora import LoraConfig, inject_lora
    from aclarena_slime.lora.checkpoint import adapter_checkpoint_root, latest_iteration
    from aclarena_slime.lora.layers import randomize_adapters
    from aclarena_slime.lora.megatron_train import megatron_training_on_cpu

    provider_module.megatron_init(_args(save=str(tmp_path)))
    model = build_tiny_gpt(tiny_shape)
    inject_lora(model, LoraConfig(rank=2, alpha=2))
    randomize_adapters(model, seed=3)
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}
    with megatron_training_on_cpu():  # dist-checkpointing synchronises the device
        fake_slime.model.save_checkpoint(
            7, [model], None, None, num_floating_point_operations_so_far=0, checkpointing_context=None
        )
    assert latest_iteration(adapter_checkpoint_root(tmp_path)) == 7
    restarted = build_tiny_gpt(tiny_shape)
    inject_lora(restarted, LoraConfig(rank=2, alpha=2))
    assert fake_slime.model.load_checkpoint([restarted], None, None, checkpointing_context={}) == (7, 0)
    assert len(fake_slime.model.backbone_loads) == 1  # the backbone still comes from --load
    assert all(torch.equal(p, trained[n]) for n, p in restarted.named_parameters() if ".lora_" in n)
    provider_module.megatron_init(_args(save=str(tmp_path / "other")))  # idempotent: wraps slime's originals once
    # no adapter checkpoint: -1, so slime starts the stage at rollout 0 (issue 27 item 4)
    assert fake_slime.model.load_checkpoint([restarted], None, None) == (-1, 0)
    assert len(fake_slime.model.backbone_loads) == 2
