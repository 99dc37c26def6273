"""Slime weight updater for LoRA runs: sends the adapter, never the backbone, after each train step.

It has the interface of slime's ``UpdateWeightFrom*`` classes (``slime/backends/megatron_utils/
update_weight``) and takes their place when the ``lora_megatron_init`` hook (:mod:`.lora`) is installed. Like them it reads
the weights through ``weights_getter`` (slime's CPU copy, refreshed after every train step by
``weights_backuper.backup("actor")``), never the live parameters: with ``--colocate`` / offload, slime
pauses the trainer's GPU memory (torch_memory_saver) right after init and calls ``update_weights``
while it sleeps, so the live tensors are unmapped then.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from aclarena_slime.adapter_swap import AdapterLedger
from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.lora.export import AttentionShape, gather_adapter, peft_adapter_config, to_peft_state_dict
from aclarena_slime.lora.layers import select_expert
from aclarena_slime.lora.sync import SyncResult, sync_adapter

logger = logging.getLogger(__name__)


class LoraWeightUpdater:
    """Gathers the adapter over TP, then global rank 0 swaps it on every SGLang engine."""

    def __init__(
        self,
        args: Any,
        model: Sequence[torch.nn.Module],
        weights_getter: Callable[[], Mapping[str, torch.Tensor]],
        *,
        model_name: str = "",
        quantization_config: dict | None = None,
    ) -> None:
        if quantization_config:
            raise ValueError("LoRA adapter sync does not support quantised rollout weights")
        self.model = model
        self.weights_getter = weights_getter
        self.config = LoraConfig.from_args(args)
        self.base_model = getattr(args, "hf_checkpoint", None)
        self.rollout_engines: Sequence[Any] = []
        self.metrics: dict[str, float] = {}

    def connect_rollout_engines(
        self, rollout_engines: Sequence[Any], rollout_engine_lock: Any = None, **_: Any
    ) -> None:
        self.rollout_engines = rollout_engines

    def disconnect_rollout_engines(self) -> None:
        self.rollout_engines = []

    def pop_metrics(self) -> dict[str, float]:
        out, self.metrics = self.metrics, {}
        return out

    def next_version(self, name: str) -> int | None:
        """With ``staleness_budget`` set, the version this sync of adapter ``name`` loads: one past the
        ledger's (a resumed run goes on counting), 0 at the first sync; None: one name, replaced in place."""
        if self.config.staleness_budget is None:
            return None
        assert self.config.sync_dir is not None  # LoraConfig.require_sync_dir
        current = AdapterLedger(self.config.sync_dir).current(name)
        return 0 if current is None else current.version + 1

    async def _sync(self, urls: list[str], name: str, tensors: dict[str, torch.Tensor]) -> SyncResult:
        """One expert's sync on a fresh event loop (its clients open and close their own HTTP sessions)."""
        return await sync_adapter(
            urls,
            name,
            tensors,
            peft_adapter_config(self.config, self.base_model),
            mode=self.config.sync_mode,
            sync_dir=self.config.sync_dir,
            schema=self.config.sglang_payload,
            pause_mode=self.config.pause_mode,
            version=self.next_version(name),
            staleness_budget=self.config.staleness_budget or 0,
        )

    @torch.no_grad()
    def adapter_tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each expert's adapter in PEFT names (one, or one per env tag with parallel MLE), from
        ``weights_getter``'s copy; a TP collective (every rank calls it)."""
        from megatron.core.utils import get_model_config

        shape = AttentionShape.from_megatron(get_model_config(self.model[0]))
        stacked = gather_adapter(self.model, self.weights_getter())
        if self.config.num_adapters == 1:
            return {self.config.adapter_names[0]: to_peft_state_dict(stacked, shape)}
        return {
            name: to_peft_state_dict(select_expert(stacked, k, self.config.rank), shape)
            for k, name in enumerate(self.config.adapter_names)
        }

    def _engine_urls(self) -> list[str]:
        import ray

        return ray.get([engine.get_url.remote() for engine in self.rollout_engines])

    @torch.no_grad()
    def update_weights(self) -> None:
        experts = self.adapter_tensors()
        if dist.get_rank() == 0 and self.rollout_engines:
            urls = self._engine_urls()
            self.metrics = {"perf/lora_sync_seconds": 0.0, "perf/lora_sync_bytes": 0.0}
            for name, tensors in experts.items():  # one adapter-only sync per expert
                result = asyncio.run(self._sync(urls, name, tensors))
                self.metrics["perf/lora_sync_seconds"] += result.seconds
                self.metrics["perf/lora_sync_bytes"] += float(result.payload_bytes)
                logger.info(
                    "LoRA %r synced to %d engines (%s) in %.2fs", name, result.servers, result.schema, result.seconds
                )
        from slime.utils.distributed_utils import get_gloo_group

        dist.barrier(group=get_gloo_group())
