"""Train-side hooks for a frozen-backbone LoRA actor (``lora_model_provider``, ``lora_megatron_init``).

A LoRA recipe passes both hooks' paths (from :data:`aclarena_slime.slime_edge.HOOKS`) with
``--only-train-params-name-list '\\.lora_[AB]\\.weight$'``, ``--dist-ckpt-strictness log_unexpected``
(a backbone checkpoint has no adapter keys) and ``aclarena_lora`` in the custom config.

``megatron_init`` installs three monkeypatches on slime's Megatron actor (slime offers no hook for
any): the reference / teacher forwards run with the adapters off, the full-weight updater is replaced
by :class:`~aclarena_slime.slime_edge.lora_updater.LoraWeightUpdater`, and checkpoints hold the adapter and its
optimizer state only, resumed from ``<--save>/lora_adapter`` after a crash
(:mod:`aclarena_slime.lora.checkpoint`).
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

from aclarena_slime.lora.config import ADAPTER_PARAM_PATTERN, LoraConfig, LoraConfigError
from aclarena_slime.lora.layers import inject_lora, set_adapters_enabled

logger = logging.getLogger(__name__)
# Model tags of slime's TensorBackuper that stand for "the backbone alone".
BACKBONE_TAGS = frozenset({"ref", "teacher"})
_SAMPLE_ADAPTER_NAME = "decoder.layers.0.self_attention.linear_qkv.lora_A.weight"
_SAMPLE_BACKBONE_NAME = "decoder.layers.0.self_attention.linear_qkv.weight"


def model_provider(pre_process: bool = True, post_process: bool = True, vp_stage: int | None = None):
    """Slime's own GPT model with LoRA adapters on the configured targets."""
    from megatron.training import get_args
    from slime.backends.megatron_utils.model_provider import _get_model_provider_func

    args = get_args()
    base_args = copy.copy(args)
    base_args.custom_model_provider_path = None  # build slime's default model, not recurse into us
    model = _get_model_provider_func(base_args, role="actor")(
        pre_process=pre_process, post_process=post_process, vp_stage=vp_stage
    )
    config = LoraConfig.from_args(args)
    inject_lora(model, config)
    if config.num_adapters > 1:  # parallel MLE: each sample's adapter index rides in from slime's batch
        from aclarena_slime.lora import routing

        routing.install(model)
    return model


def check_args(args: Any) -> LoraConfig:
    """Refuse slime settings that cannot work with a frozen backbone; fill the trainable-name list."""
    config = LoraConfig.from_args(args)
    config.require_sync_dir()
    if getattr(args, "sequence_parallel", False):
        raise LoraConfigError("LoRA does not support --sequence-parallel; drop it")
    if getattr(args, "save_hf", None):
        raise LoraConfigError(
            "--save-hf converts every parameter to HF names and fails on adapters; export with export_peft"
        )
    if getattr(args, "update_weight_transport", None) == "disk":
        raise LoraConfigError(
            "with LoRA use the adapter's own disk sync (aclarena_lora.sync_mode: disk), not --update-weight-transport disk"
        )
    if config.num_adapters > 1 and getattr(args, "allgather_cp", False):
        raise LoraConfigError(
            "lora experts (parallel MLE) need slime's per-sample context-parallel split; drop --allgather-cp"
        )
    patterns = getattr(args, "only_train_params_name_list", None)
    if not patterns:
        args.only_train_params_name_list = [ADAPTER_PARAM_PATTERN]
    elif any(re.search(p, _SAMPLE_BACKBONE_NAME) for p in patterns) or not any(
        re.search(p, _SAMPLE_ADAPTER_NAME) for p in patterns
    ):
        raise LoraConfigError(
            f"--only-train-params-name-list {patterns} must select the adapters and nothing else; use {ADAPTER_PARAM_PATTERN!r}"
        )
    return config


def megatron_init(args: Any) -> None:
    """``--custom-megatron-init-path`` hook: validate, then patch slime's actor (idempotent)."""
    config = check_args(args)
    from slime.backends.megatron_utils import actor as actor_module
    from slime.backends.megatron_utils import model as model_module

    from aclarena_slime.lora.checkpoint import install as install_adapter_checkpoints
    from aclarena_slime.slime_edge.lora_updater import LoraWeightUpdater

    actor_cls = actor_module.MegatronTrainRayActor
    if not getattr(actor_cls, "_aclarena_lora_patched", False):
        original = actor_cls._switch_model

        def _switch_model(self, target_tag: str) -> None:
            original(self, target_tag)
            set_adapters_enabled(self.model, target_tag not in BACKBONE_TAGS)

        actor_cls._switch_model = _switch_model
        actor_cls._aclarena_lora_patched = True
    for name in ("UpdateWeightFromTensor", "UpdateWeightFromDistributed", "UpdateWeightFromDisk"):
        setattr(actor_module, name, LoraWeightUpdater)
    # slime's model.save / initialize_model_and_optimizer call these two names (runs before the model is built).
    install_adapter_checkpoints(model_module, getattr(args, "save", None))
    logger.info(
        "aclarena LoRA: rank=%d alpha=%g targets=%s adapter=%r",
        config.rank,
        config.alpha,
        config.target_modules,
        config.adapter_name,
    )
