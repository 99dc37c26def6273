"""Frozen-backbone LoRA for slime's Megatron actor: adapters, PEFT export, adapter-only sync to SGLang.

Slime's hooks for it (model provider, Megatron init) live in :mod:`aclarena_slime.slime_edge.lora`, the
adapter-only weight updater that Megatron init installs in :mod:`aclarena_slime.slime_edge.lora_updater`.
The names below are imported on first use, so reading :mod:`aclarena_slime.lora.config` (plain
settings) does not load torch and aiohttp — the CLI's start-up time depends on it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ADAPTER_PARAM_PATTERN": "config",
    "LoraConfig": "config",
    "LoraConfigError": "config",
    "export_peft": "export",
    "adapters_disabled": "layers",
    "inject_lora": "layers",
    "set_adapters_enabled": "layers",
    "AdapterSyncError": "sync",
    "SyncResult": "sync",
    "sync_adapter": "sync",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
