"""Log-prob parity on demand, on the local backend: what ``aclarena doctor`` runs for a local recipe.

The stage's own model, engine, rollout and trainer (nothing stood in): one rollout step of the stage's
first prompts, served through the stage's adapter, and the trainer's recompute of the same tokens,
compared by :mod:`aclarena_slime.parity` at :data:`~aclarena_slime.parity.LOCAL_TOLERANCE`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from typing import Any

from aclarena_slime import parity
from aclarena_slime.local.config import LocalStageConfig
from aclarena_slime.local.records import stage_records
from aclarena_slime.local.rollouts import rollout_step, step_sampling, to_train_sample
from aclarena_slime.local.stage import serve_policy, served_stage, stage_model, tokenizer_texts, train_settings
from aclarena_slime.local.trainer import PolicyTrainer

PROMPTS, SAMPLES, TOKENS = 2, 2, 16  # a probe, not a run: a few short rollouts


async def probe(cfg: LocalStageConfig) -> parity.ParityReport:
    """Roll out a few of the stage's prompts and compare; the report (not raised: the doctor lists it)."""
    cfg = dataclasses.replace(
        cfg, prompts_per_step=PROMPTS, samples_per_prompt=SAMPLES, max_response_len=TOKENS, warm_start_steps=0
    )
    model_dir = stage_model(cfg, await tokenizer_texts(cfg))
    lora = None if cfg.full_finetune else cfg.lora
    trainer = PolicyTrainer.build(model_dir, train_settings(cfg), lora, cfg.base_adapter, cfg.seed)
    async with served_stage(cfg, model_dir) as stage:
        if lora is not None:
            await serve_policy(stage, trainer, cfg.expert_name, cfg.adapter_dir, loaded=False)
        records = stage_records(stage.env, cfg).train[:PROMPTS]
        sampling = step_sampling(cfg)
        samples = await rollout_step(stage.context, records, sampling, 0, asyncio.Semaphore(cfg.max_concurrency))
    batch = [to_train_sample(s) for s in samples if s.usable]
    engine = [s.rollout_log_probs for s in batch]
    masks = [s.loss_mask for s in batch]
    return parity.compare(engine, trainer.recompute_log_probs(batch), masks, parity.LOCAL_TOLERANCE)


def run_probe(cfg: LocalStageConfig) -> dict[str, Any]:
    """:func:`probe` from synchronous code, in a scratch folder (a stage's outputs stay untouched); the
    report as plain values."""
    with tempfile.TemporaryDirectory(prefix="aclarena-parity-") as scratch:
        report = asyncio.run(probe(dataclasses.replace(cfg, output_dir=scratch)))
    return {**dataclasses.asdict(report), "ok": report.ok, "line": report.line()}
