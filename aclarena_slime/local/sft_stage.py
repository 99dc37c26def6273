"""An SFT warm-start stage on the local backend: teacher rollouts, the shared warm-start filter, SFT on what is kept.

What the paper's chain does before search and retail RL (a teacher's rollouts, filtered, then SFT), made
small enough for a CPU: the teacher is the stage's starting point (the previous stage's adapter, served
by the embedded engine), its rollouts go through the real rollout functions, the filter is the one the
SFT data command applies (:func:`aclarena_slime.distill.sdft.build_mixture`, with the recipe's
``aclarena_sft_filter``), and the kept episodes train the adapter with cross-entropy on their model tokens
(loss mask 1: exactly the tokens the teacher sampled, as the authors' pre-tokenized TauSFT data). The output
folder has the RL stage's layout (``adapter/``, ``metrics.json``), so the next stage chains from it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from aclarena_slime.distill.dumps import episode_from_record
from aclarena_slime.distill.sdft import MixtureSettings, build_mixture
from aclarena_slime.jsonl import write_json_atomic
from aclarena_slime.local.config import LocalStageConfig
from aclarena_slime.local.records import Sample, demo_records
from aclarena_slime.local.sft import SftExample
from aclarena_slime.local.sft import sft_step as shared_sft_step
from aclarena_slime.local.stage import (
    EVAL_SEED_OFFSET,
    bind_engine,
    evaluate,
    lora_trainer,
    rollout_step,
    served_stage,
    stage_model,
    to_train_sample,
)
from aclarena_slime.local.trainer import LoraTrainer, TrainSample, TrainSettings
from aclarena_slime.sglang_client import SGLangClient

FILTER_KEYS = ("min_reward", "statuses", "max_tokens")


def filter_settings(values: Mapping[str, Any] | None) -> MixtureSettings:
    """The recipe's ``aclarena_sft_filter`` ({min_reward, statuses, max_tokens}) as the pipeline's settings."""
    values = dict(values or {})
    unknown = sorted(set(values) - set(FILTER_KEYS))
    if unknown or "min_reward" not in values:
        raise ValueError(
            f"aclarena_sft_filter needs min_reward and knows {', '.join(FILTER_KEYS)}; got {sorted(values)}"
        )
    return MixtureSettings(
        default_threshold=float(values["min_reward"]),
        statuses=tuple(values.get("statuses") or ("completed",)),
        max_tokens=values.get("max_tokens"),
    )


def run_sft_stage(cfg: LocalStageConfig, settings: MixtureSettings, epochs: int = 1) -> dict[str, Any]:
    """Run the warm start; returns the metrics (also written to ``cfg.metrics_path``)."""
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    return asyncio.run(_run(cfg, settings, epochs))


async def _run(cfg: LocalStageConfig, settings: MixtureSettings, epochs: int) -> dict[str, Any]:
    started = time.monotonic()
    model_dir = stage_model(cfg)
    train_settings = TrainSettings(lr=cfg.lr, temperature=cfg.temperature, micro_batch_size=cfg.micro_batch_size)
    trainer = lora_trainer(cfg, model_dir, train_settings)
    adapter_dir = trainer.save(cfg.adapter_dir)
    async with served_stage(cfg, model_dir) as (_engine, url, env):
        result = await _stage(cfg, settings, epochs, url, env, trainer, model_dir, adapter_dir)
    result.update(model_dir=str(model_dir), adapter_dir=str(adapter_dir), seconds=round(time.monotonic() - started, 2))
    write_json_atomic(cfg.metrics_path, result)
    return result


async def _stage(cfg, settings, epochs, url, env, trainer, model_dir, adapter_dir) -> dict[str, Any]:
    client = SGLangClient(url)
    name = cfg.expert_name
    await client.load_lora_adapter(name, str(adapter_dir))
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    args = SimpleNamespace(
        sglang_router_ip=host,
        sglang_router_port=int(port),
        hf_checkpoint=str(model_dir),
        rollout_max_response_len=cfg.max_response_len,
        aclarena_env_config={cfg.env: bind_engine(cfg.env_config, url, cfg.served_name)},
        aclarena_experts={cfg.env: name},
    )
    limit = asyncio.Semaphore(cfg.max_concurrency)
    evaluation = demo_records(env, cfg.eval_size, cfg.seed + EVAL_SEED_OFFSET) if cfg.eval_size else []
    before = await evaluate(args, evaluation, cfg, limit)
    # The teacher's rollouts: the starting adapter on the env's demo prompts, through the real rollout path.
    teacher = await rollout_step(args, demo_records(env, cfg.steps * cfg.prompts_per_step, cfg.seed), cfg, 0, limit)
    kept, report = keep(teacher, cfg.env, settings)
    steps = []
    for epoch in range(epochs if kept else 0):
        stats = await asyncio.to_thread(sft_step, trainer, [to_train_sample(s) for s in kept], cfg.micro_batch_size)
        steps.append({"epoch": epoch, **stats})
    trainer.save(adapter_dir)
    await client.unload_lora_adapter(name)
    await client.load_lora_adapter(name, str(adapter_dir))
    after = await evaluate(args, evaluation, cfg, limit)
    return {
        "backend": "local",
        "kind": "sft",
        "env": cfg.env,
        "expert": name,
        "config": cfg.to_dict(),
        "teacher_rollouts": len(teacher),
        "kept": len(kept),
        "filter": report.to_dict().get(cfg.env, {}),
        "eval_before": before,
        "eval_after": after,
        "steps": steps,
    }


def keep(samples: Sequence[Sample], domain: str, settings: MixtureSettings) -> tuple[list[Sample], Any]:
    """The samples the warm-start filter keeps (the SFT data pipeline's own rules), in order."""
    episodes = [episode_from_record(_dump(sample), str(i), domain) for i, sample in enumerate(samples)]
    records, report = build_mixture(episodes, settings)
    return [samples[int(record["metadata"]["origin"])] for record in records], report


def _dump(sample: Sample) -> dict[str, Any]:
    """The fields of slime's ``Sample.to_dict()`` the filter reads."""
    return {
        "metadata": sample.metadata,
        "reward": sample.reward,
        "status": sample.status.value,
        "tokens": list(sample.tokens or []),
        "loss_mask": list(sample.loss_mask or []),
        "remove_sample": bool(getattr(sample, "remove_sample", False)),
    }


def sft_step(trainer: LoraTrainer, samples: Sequence[TrainSample], micro_batch_size: int = 8) -> dict[str, float]:
    """One optimiser step of cross-entropy on the samples' loss-mask tokens, through the shared SFT step
    (:func:`aclarena_slime.local.sft.sft_step`): the prompt is context, the mask-1 response tokens are trained."""
    examples = [
        SftExample(list(s.tokens), [0] * (len(s.tokens) - s.response_length) + list(s.loss_mask))
        for s in samples
        if s.response_length > 0 and sum(s.loss_mask) > 0 and len(s.tokens) > s.response_length
    ]
    if not examples:
        return {"samples": 0.0, "loss_tokens": 0.0, "loss": 0.0}
    stats = shared_sft_step(
        trainer.model, trainer.optimizer, examples, trainer.pad_id, micro_batch_size, trainer.settings.max_grad_norm
    )
    return {"samples": float(len(examples)), "loss_tokens": stats["tokens"], "loss": stats["loss"]}
