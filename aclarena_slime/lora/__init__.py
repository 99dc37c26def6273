"""Frozen-backbone LoRA for slime's Megatron actor: adapters, PEFT export, adapter-only sync to SGLang.

Slime's hooks for it (model provider, Megatron init, the adapter-only weight updater) live in
:mod:`aclarena_slime.slime_edge.lora`.
"""

from .config import ADAPTER_PARAM_PATTERN, LoraConfig, LoraConfigError
from .export import export_peft
from .layers import adapters_disabled, inject_lora, set_adapters_enabled
from .sync import AdapterSyncError, SyncResult, sync_adapter

__all__ = [
    "ADAPTER_PARAM_PATTERN",
    "AdapterSyncError",
    "LoraConfig",
    "LoraConfigError",
    "adapters_disabled",
    "export_peft",
    "inject_lora",
    "set_adapters_enabled",
    "sync_adapter",
    "SyncResult",
]
