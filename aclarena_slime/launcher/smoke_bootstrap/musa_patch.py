"""slime's accelerator bootstrap, used by the smoke run: a do-nothing device on a machine without one.

slime imports ``musa_patch`` from the folder ``MUSA_PATCH_PATH`` names before it validates the MUSA
backend (``slime/utils/accelerator/__init__.py``, ``_make_selected``); setting that variable also
selects that backend. This module gives ``torch.musa`` just what slime's ``MUSAAccelerator`` asks of
it on the rollout-only path: one device, always available, with no memory and nothing to do. A real
``torch.musa`` is never replaced. Used only by ``launch/stage.sh RECIPE --smoke``, where slime runs
``--debug-rollout-only`` against an external engine, so no tensor is ever placed on this device.
"""

from __future__ import annotations

import types
from typing import Any

import torch


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _no_memory(*args: Any, **kwargs: Any) -> tuple[int, int]:
    return 0, 0


def do_nothing_device() -> types.ModuleType:
    device = types.ModuleType("torch.musa")
    device.__dict__.update(
        is_available=lambda: True,
        device_count=lambda: 1,
        current_device=_zero,
        set_device=_nothing,
        synchronize=_nothing,
        empty_cache=_nothing,
        ipc_collect=_nothing,
        manual_seed=_nothing,
        manual_seed_all=_nothing,
        initial_seed=_zero,
        memory_allocated=_zero,
        memory_reserved=_zero,
        mem_get_info=_no_memory,
        is_bf16_supported=lambda: False,
        get_rng_state=lambda *a, **k: torch.get_rng_state(),
        set_rng_state=_nothing,
    )
    return device


if getattr(torch, "musa", None) is None:
    torch.musa = do_nothing_device()
