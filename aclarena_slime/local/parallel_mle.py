"""Parallel MLE on the local backend: every env's LoRA expert trained side by side on one frozen backbone.

With the backbone frozen the experts do not depend on each other, so one job trains them all: one engine
serves every expert (each request carries ``lora_path`` = the expert of its env tag, and the engine mixes
adapters within a batch), one :class:`MultiExpertTrainer` holds one PEFT model with N named adapters on a
single copy of the backbone, and each env's samples train only that env's adapter (the adapter is
selected for the env's micro-batches; the others see no gradient and keep their own optimiser). Each step
rolls out every expert's prompts at once, takes one GRPO step per expert, and syncs each adapter to the
engine (unload + load, as on slime): the N-expert case of the stage's one GRPO loop
(:func:`~aclarena_slime.local.stage.grpo_loop`), with its parity check, validation and greedy evaluation. Outputs::

    base_model/         the tiny model, when model="tiny"
    experts/<tag>/      one PEFT folder per expert (the served adapter)
    experts.json        the manifest (ExpertTable): env tag -> expert
    metrics.json        per expert: held-out reward before and after (greedy, validation), per-step figures

Each expert is a :class:`~aclarena_slime.local.session.LocalSession` (env, data, optimiser, LoRA); they share the
backbone (``model_source``, seed, tiny shape) and the engine settings. Seeds are the same as a stage
alone: an expert trained here starts from the same adapter, sees the same records and sampling seeds,
and takes the same optimiser steps as when :func:`~aclarena_slime.local.stage.run_stage` trains it alone
(tests/local/test_parallel_mle.py bounds the difference).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from aclarena_slime.experts import EXPERTS_NAME, ExpertTable
from aclarena_slime.jsonl import write_json_atomic
from aclarena_slime.local.config import LocalConfigError
from aclarena_slime.local.records import bind_engine
from aclarena_slime.local.session import LocalSession
from aclarena_slime.local.stage import (
    Expert,
    adapter_files,
    grpo_loop,
    publish_adapter,
    served_stage,
    stage_model,
)
from aclarena_slime.local.trainer import PolicyTrainer, TrainSample, TrainSettings, peft_lora_config
from aclarena_slime.lora.config import LoraConfig

# Settings every expert must share (named as the recipe's local settings): the one backbone and the one engine.
SHARED: dict[str, Callable[[LocalSession], Any]] = {
    "model_source": lambda s: s.model.source,
    "seed": lambda s: s.seed,
    "tiny_vocab_size": lambda s: s.model.shape.vocab_size,
    "tiny_hidden_size": lambda s: s.model.shape.hidden_size,
    "tiny_layers": lambda s: s.model.shape.num_layers,
    "max_running_requests": lambda s: s.engine.settings.max_running_requests,
    "max_prefill_tokens": lambda s: s.engine.settings.max_prefill_tokens,
    "served_name": lambda s: s.engine.served_name,
    "engine_host": lambda s: s.engine.host,
    "engine_port": lambda s: s.engine.port,
    "torch_threads": lambda s: s.model.torch_threads,
    "micro_batch_size": lambda s: s.policy.train.backprop.micro_batch_size,
    "max_response_len": lambda s: s.engine.budgets.max_response_len,
    "response_budget": lambda s: s.engine.budgets.mode,
}


class BackboneView:
    """The shared backbone with every adapter off: the KL reference of each expert (the policy a LoRA stage
    starts from, B = 0), without a second copy of the backbone."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, **inputs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(**inputs)


class MultiExpertTrainer:
    """N LoRA experts on one backbone: one PEFT model holding N named adapters, one optimiser per expert.

    Each expert is a :class:`PolicyTrainer` over the shared model whose parameters are that adapter's only;
    :meth:`step` selects the expert's adapter for its samples, so a sample's loss reaches its own adapter
    and no other (the others are inactive: no gradient, no optimiser step).
    """

    def __init__(self, model: Any, experts: Mapping[str, PolicyTrainer]) -> None:
        self.model = model
        self.experts = dict(experts)

    @classmethod
    def build(
        cls, model_dir: str | Path, experts: Mapping[str, tuple[TrainSettings, LoraConfig]], seed: int = 0
    ) -> MultiExpertTrainer:
        """Load the backbone once and add one fresh adapter per expert, each initialised from ``seed`` as
        :meth:`PolicyTrainer.build` initialises a lone expert (so side by side equals alone)."""
        from peft import get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not experts:
            raise ValueError("parallel MLE needs at least one expert")
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        for name, (_, lora) in experts.items():
            config = peft_lora_config(lora)
            torch.manual_seed(seed)  # the same draw as a lone expert's fresh adapter
            if hasattr(model, "add_adapter") and hasattr(model, "peft_config"):
                model.add_adapter(name, config)
            else:
                model = get_peft_model(model, config, adapter_name=name)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        reference = BackboneView(model)
        trainers = {}
        for name, (settings, _) in experts.items():
            model.set_adapter(name)  # marks this adapter's parameters (only) trainable
            trainers[name] = PolicyTrainer(model, settings, pad_id=int(pad or 0), reference=reference)
        return cls(model, trainers)

    def step(self, name: str, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One GRPO step of expert ``name`` on its own samples (its adapter alone is active and trainable)."""
        if name not in self.experts:
            raise KeyError(f"no expert {name!r}; experts: {sorted(self.experts)}")
        self.model.set_adapter(name)
        return self.experts[name].step(samples)

    def recompute_log_probs(self, name: str, samples: Sequence[TrainSample]) -> list[list[float]]:
        """Expert ``name``'s log-probs of ``samples`` (its adapter active): the parity check's trainer side."""
        if name not in self.experts:
            raise KeyError(f"no expert {name!r}; experts: {sorted(self.experts)}")
        self.model.set_adapter(name)
        return self.experts[name].recompute_log_probs(samples)

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """The expert's adapter tensors (PEFT names, without the adapter name), detached copies."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model, adapter_name=name).items()}


def open_experts(sessions: Sequence[LocalSession]) -> list[LocalSession]:
    """The experts' sessions (:func:`~aclarena_slime.local.run.expert_sessions`), checked: expert settings that
    cannot share one backbone and one engine are refused, naming them."""
    if not sessions:
        raise LocalConfigError("parallel MLE needs at least one expert")
    names = [s.policy.name for s in sessions]
    envs = [s.env for s in sessions]
    if len(set(names)) != len(names) or len(set(envs)) != len(sessions):
        raise LocalConfigError(f"parallel MLE trains one expert per env tag; got envs {envs}")
    for session in sessions:
        refused = {
            "kind": (session.kind, session.kind != "rl"),
            "full_finetune": (session.policy.full, session.policy.full),
            "warm_start_steps": (session.warm_start and session.warm_start.sft.steps, session.warm_start is not None),
            "base_adapter": (session.policy.base_adapter, session.policy.base_adapter is not None),
            "monitor": (session.monitor, bool(session.monitor)),
            "replay": (session.records.replay, bool(session.records.replay)),
        }
        for key, (value, bad) in refused.items():
            if bad:
                raise LocalConfigError(
                    f"parallel MLE expert {session.env!r}: {key}={value!r} is not supported (the experts "
                    "are fresh GRPO LoRA adapters on one frozen backbone)"
                )
        for key, part in SHARED.items():
            if part(session) != part(sessions[0]):
                raise LocalConfigError(
                    f"parallel MLE experts share one backbone and engine: {key} is {part(sessions[0])!r} for "
                    f"{sessions[0].env!r} but {part(session)!r} for {session.env!r}"
                )
    return list(sessions)


def run_parallel_mle(sessions: Sequence[LocalSession], output_dir: str | Path) -> dict[str, Any]:
    """Train every expert (:func:`open_experts`) side by side; returns the metrics (also ``output_dir/metrics.json``)."""
    return asyncio.run(run_experts(sessions, output_dir))


async def run_experts(sessions: Sequence[LocalSession], output_dir: str | Path) -> dict[str, Any]:
    """The experts' sessions trained by the one GRPO loop, on one backbone and one engine."""
    started, cpu_started = time.monotonic(), time.process_time()
    out = Path(output_dir).resolve()
    first = sessions[0]
    served_name = first.engine.served_name
    model_dir = stage_model(first.model, out, first.seed)  # the one backbone (the tiny model written once, under out/)
    trainer = MultiExpertTrainer.build(
        model_dir, {s.policy.name: (s.policy.train, s.policy.lora) for s in sessions}, seed=first.seed
    )
    dirs = {s.policy.name: out / "experts" / s.policy.name for s in sessions}
    served = served_stage(
        first.engine,
        model_dir,
        first.seed,
        env_configs=lambda url, name: {s.env: bind_engine(s.records.env_config, url, name) for s in sessions},
        experts=ExpertTable.from_mapping({s.env: s.policy.name for s in sessions}),
    )  # one engine on the backbone, one rollout context holding every expert's env
    async with served as stage:
        client = stage.context.client()

        def expert(session: LocalSession) -> Expert:  # its step, its parity recompute, its adapter-only sync
            name = session.policy.name

            async def publish(loaded: bool) -> None:
                await publish_adapter(client, name, dirs[name], adapter_files(trainer.model, name), loaded)

            step, recompute = functools.partial(trainer.step, name), functools.partial(trainer.recompute_log_probs, name)
            return Expert(session.records, session.loop, step, recompute, publish)

        results = await grpo_loop(stage.context, [expert(s) for s in sessions])
        generated = await stage.generated_tokens()
    table = ExpertTable.from_mapping(
        {
            "base": {"name": served_name, "path": str(model_dir)},
            "experts": {
                s.env: {"adapter": s.policy.name, "path": f"experts/{s.policy.name}", "stage": "mle_parallel"}
                for s in sessions
            },
        },
        root=out,
    )
    table.save(out / EXPERTS_NAME)
    result = {
        "backend": "local",
        "kind": "parallel_mle",
        "seed": first.seed,
        "model_dir": str(model_dir),
        "experts": {
            s.env: {
                "expert": s.policy.name,
                "adapter_dir": str(dirs[s.policy.name]),
                **figures,
                "config": dict(s.settings),
            }
            for s, figures in zip(sessions, results, strict=True)
        },
        "seconds": round(time.monotonic() - started, 2),
        "cpu_seconds": round(time.process_time() - cpu_started, 2),
        "engine_generated_tokens": generated,
    }
    write_json_atomic(out / "metrics.json", result)
    return result
