"""The local backend's small shared types, free of torch: the embedded engine's batching, the model folder an
adapter was trained on, the error a local setting raises.

A stage's settings are the recipe's: :func:`aclarena_slime.local.session.open_session` reads them into the parts
the phases take.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from aclarena_slime.recipes.local_section import TINY_MODEL, LocalBackendSettings, LocalConfigError  # noqa: F401 - TINY_MODEL, LocalConfigError: the stage's readers import them from here


@dataclass(frozen=True)
class EngineSettings:
    """How much the embedded engine batches (SGLang's server-argument names).

    ``max_running_requests``: sequences decoding together, one forward per step for all of them; more
    wait in a queue. ``max_prefill_tokens``: the most prompt tokens one prefill takes (real tokens, as
    SGLang counts them: the prefill is packed), so a burst of long prompts joins over a few steps
    instead of stalling the decode; a longer prompt still runs, alone. The defaults suit a 2-core laptop and the tiny models: one GRPO step of
    8 prompts x 8 samples decodes as one batch (``docs/local-engine.md`` has the measurements).
    """

    max_running_requests: int = LocalBackendSettings.max_running_requests
    max_prefill_tokens: int = LocalBackendSettings.max_prefill_tokens

    def __post_init__(self) -> None:
        for name in ("max_running_requests", "max_prefill_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LocalConfigError(f"{name} must be a positive integer, got {value!r}")


def adapter_backbone(adapter: str | None) -> str | None:
    """The model folder a PEFT adapter was trained on, when its config names one that exists here."""
    if not adapter:
        return None
    config = Path(adapter) / "adapter_config.json"
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError):
        return None
    return base if isinstance(base, str) and (Path(base) / "config.json").is_file() else None
