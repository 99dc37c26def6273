"""Log-prob parity on demand, on the local backend: what ``aclarena doctor`` runs for a local recipe.

The stage's own model, engine, rollout and trainer (nothing stood in): one rollout step of the stage's
first prompts, served through the stage's adapter, and the trainer's recompute of the same tokens,
compared by :mod:`aclarena_slime.parity` at :data:`~aclarena_slime.parity.LOCAL_TOLERANCE`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import tempfile
from pathlib import Path
from typing import Any

from aclarena_slime import parity
from aclarena_slime.local.records import stage_env_configs, stage_records
from aclarena_slime.local.rollouts import rollout_step, to_train_sample
from aclarena_slime.local.session import LocalSession
from aclarena_slime.local.stage import serve_policy, served_stage, stage_model, tokenizer_texts
from aclarena_slime.local.trainer import PolicyTrainer

PROMPTS, SAMPLES, TOKENS = 2, 2, 16  # a probe, not a run: a few short rollouts


async def probe(session: LocalSession) -> parity.ParityReport:
    """Roll out a few of the stage's prompts and compare; the report (not raised: the doctor lists it)."""
    policy = session.policy
    model_dir = stage_model(session.model, session.paths.output_dir, session.seed, await tokenizer_texts(session))
    trainer = PolicyTrainer.build(model_dir, policy.train, policy.lora, policy.base_adapter, session.seed)
    env_configs = functools.partial(stage_env_configs, session.records)
    async with served_stage(session.engine, model_dir, session.seed, env_configs) as stage:
        if not policy.full:
            await serve_policy(stage, trainer, policy.name, session.paths.adapter_dir, loaded=False)
        records = stage_records(stage.env, session.records).train[:PROMPTS]
        limit = asyncio.Semaphore(session.loop.max_concurrency)
        samples = await rollout_step(stage.context, records, session.loop.sampling, 0, session.seed, limit)
    batch = [to_train_sample(s) for s in samples if s.usable]
    engine = [s.rollout_log_probs for s in batch]
    masks = [s.loss_mask for s in batch]
    return parity.compare(engine, trainer.recompute_log_probs(batch), masks, parity.LOCAL_TOLERANCE)


def probe_session(session: LocalSession, scratch: Path) -> LocalSession:
    """The stage's session made a probe: :data:`PROMPTS` prompts of :data:`SAMPLES` rollouts of at most
    :data:`TOKENS` tokens, no warm start, its outputs in ``scratch``; every other part the stage's own (its
    training records drawn as the stage would draw them for a step of that many prompts)."""
    loop, records, settings = session.loop, session.records, session.settings
    over_sampling = settings["rollout"]["over_sampling_batch_size"]  # a round's prompts: this, else a step's
    groups = dataclasses.replace(loop.sampling.groups, samples=SAMPLES)
    sampling = dataclasses.replace(loop.sampling, groups=groups, prompts_per_step=PROMPTS,
                                   prompts_per_round=over_sampling or PROMPTS)  # fmt: skip
    budgets = dataclasses.replace(session.engine.budgets, max_response_len=TOKENS)
    sizes = {"rollout": {**settings["rollout"], "rollout_batch_size": PROMPTS, "n_samples_per_prompt": SAMPLES,
                         "rollout_max_response_len": TOKENS},
             "local": {**settings["local"], "warm_start_steps": 0}, "output_dir": str(scratch)}  # fmt: skip
    return dataclasses.replace(
        session,
        paths=dataclasses.replace(session.paths, output_dir=scratch),
        engine=dataclasses.replace(session.engine, budgets=budgets),
        records=dataclasses.replace(records, train_prompts=loop.steps * sampling.prompts_per_round,
                                    warm_start_records=0),  # fmt: skip
        loop=dataclasses.replace(loop, sampling=sampling),
        policy=dataclasses.replace(session.policy, train=dataclasses.replace(session.policy.train, rollouts=groups)),
        warm_start=None,
        settings={**settings, **sizes},
    )


def run_probe(session: LocalSession) -> dict[str, Any]:
    """:func:`probe` on a few short rollouts of the stage's (:func:`probe_session`), from synchronous code, in a
    scratch folder (a stage's outputs stay untouched); the report as plain values."""
    with tempfile.TemporaryDirectory(prefix="aclarena-parity-") as scratch:
        report = asyncio.run(probe(probe_session(session, Path(scratch))))
    return {**dataclasses.asdict(report), "ok": report.ok, "line": report.line()}
