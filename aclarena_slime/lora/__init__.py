"""Frozen-backbone LoRA for slime's Megatron actor: adapters, PEFT export, adapter-only sync to SGLang.

Slime hooks (dotted paths for slime's command line) live in :mod:`aclarena_slime.lora.provider`.
The names below are imported on first use: the settings type (:mod:`.config`, which every recipe's
``lora:`` section is) must not pull in torch and megatron-core.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
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

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_WHERE[name]}", __name__), name)
