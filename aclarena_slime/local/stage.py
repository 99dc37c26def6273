"""The local backend's one runner: phases warm start | SFT | GRPO over one served engine and one rollout context.

:func:`run_stage` is what ``launch/stage.sh`` runs on a machine without slime or a GPU (the recipe is
mapped onto :class:`~aclarena_slime.local.config.LocalStageConfig` by :mod:`aclarena_slime.local.spec`).
The rollouts go through the shared rollout (:func:`~aclarena_slime.rollout.run_sample`,
:func:`~aclarena_slime.rollout.score_sample`) over HTTP against the embedded engine, with a
:class:`~aclarena_slime.rollout.RolloutContext` built here from the stage's settings. Phases:

- warm start (``warm_start_steps`` > 0; the paper's Base -> SFT -> RL shape): the base model is evaluated,
  fine-tuned in full on the env's gold demo trajectories (:mod:`.demos`, :mod:`.sft`); the result is the
  backbone of the rest of the stage.
- SFT (``kind="sft"``, a warm-start recipe): the starting policy's rollouts (the teacher), filtered by the
  recipe's ``aclarena_sft_filter`` with the SFT data pipeline's own rules, train the policy by cross-entropy.
- GRPO (``kind="rl"``): rollouts, group-normalised rewards, PPO-clipped steps, optionally a KL term to the
  starting policy; after each step the policy is synced to the engine.

The policy is a LoRA expert (``adapter/``, a PEFT folder) or, with full fine-tuning, the whole model
(``model/``, a Hugging Face folder). Output folder::

    base_model/        the tiny model, when model="tiny"
    warm_start_model/  the backbone after the SFT warm start, when there is one
    adapter/ | model/  the trained policy
    metrics.json       seed, settings, per-phase figures, held-out reward before and after, validation curve

``eval_before`` is the base model's held-out reward, ``eval_warm_start`` the reward after the warm start,
``eval_after`` the trained policy's; all on the same held-out records, which share no prompt with any
training record.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aclarena_slime import parity
from aclarena_slime.adapter_swap import adapter_checksum, swap_adapter
from aclarena_slime.evaluation.monitor import StageMonitor
from aclarena_slime.evaluation.suite import HELD_OUT_SEED
from aclarena_slime.experts import ExpertTable
from aclarena_slime.jsonl import write_json_atomic
from aclarena_slime.local.config import TINY_MODEL, LocalStageConfig
from aclarena_slime.local.demos import demo_examples, load_demo_turns
from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.generation import MultiLoraModel
from aclarena_slime.local.group_filter import GroupFilter, PromptStream, SampledStep, sample_groups
from aclarena_slime.local.records import (
    Sample,
    StageRecords,
    bind_engine,
    new_sample,
    replay_mixture,
    stage_env_configs,
    stage_records,
)
from aclarena_slime.local.sft import SftExample, SftSettings, frozen_copy, train_sft, warm_start
from aclarena_slime.local.tiny_model import TinyShape, save_tiny_checkpoint
from aclarena_slime.local.trainer import PolicyTrainer, TrainSample, TrainSettings, contiguous_parts
from aclarena_slime.plugin.registry import get_environment
from aclarena_slime.rollout import Budgets, RolloutContext, load_chat_tokens, run_sample, score_sample

if TYPE_CHECKING:  # the SFT phase's filter: imported when an SFT stage runs
    from aclarena_slime.distill.sdft import MixtureSettings


class LocalStageError(RuntimeError):
    """The stage cannot run as configured (model folder, data); the message says what to change."""


def run_stage(cfg: LocalStageConfig) -> dict[str, Any]:
    """Run the stage; returns the metrics (also written to ``cfg.metrics_path``)."""
    if cfg.progress:  # one progress bar, ours: transformers' own bars would interleave with it
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return asyncio.run(run_stage_async(cfg))


async def run_stage_async(cfg: LocalStageConfig) -> dict[str, Any]:
    started = time.monotonic()
    model_dir = start_dir = stage_model(cfg, await tokenizer_texts(cfg))
    warm: dict[str, Any] | None = None
    into_policy = cfg.warm_start_steps and cfg.warm_start_target == "policy"
    if cfg.warm_start_steps and not into_policy:
        model_dir, warm = await warm_start_phase(cfg, model_dir)
    trainer = PolicyTrainer.build(
        model_dir, train_settings(cfg), None if cfg.full_finetune else cfg.lora, cfg.base_adapter, cfg.seed
    )
    if cfg.kl_coef and cfg.full_finetune and model_dir != start_dir:
        # The KL anchor's reference is the policy the stage starts from, in the GRPO phase as in the warm start
        # before it, not the warm-started model.
        trainer.reference = load_reference(start_dir)
    if into_policy:
        warm = await policy_warm_start(cfg, model_dir, trainer)
    async with served_stage(cfg, model_dir) as stage:
        phase = sft_phase if cfg.kind == "sft" else grpo_phase
        result = await phase(cfg, stage, trainer)
    result = {
        "backend": "local",
        "kind": cfg.kind,
        "env": cfg.env,
        "seed": cfg.seed,
        "expert": None if cfg.full_finetune else cfg.expert_name,
        "model_dir": str(model_dir),
        **({"policy_dir": str(cfg.policy_dir)} if cfg.full_finetune else {"adapter_dir": str(cfg.adapter_dir)}),
        "config": cfg.to_dict(),
        **result,
    }
    if warm is not None:
        result["eval_warm_start"] = result["eval_before"]
        result["eval_before"] = warm.pop("eval_before")
        result["warm_start"] = warm
    result["seconds"] = round(time.monotonic() - started, 2)
    result["engine_generated_tokens"] = stage.engine.generated_tokens + (warm or {}).get("engine_generated_tokens", 0)
    write_json_atomic(cfg.metrics_path, result)
    return result


def train_settings(cfg: LocalStageConfig) -> TrainSettings:
    """The optimiser and loss settings of the stage's policy (the recipe's, see :mod:`.spec`)."""
    return TrainSettings(
        lr=cfg.lr,
        temperature=cfg.temperature,
        clip_eps_low=cfg.clip_eps_low,
        clip_eps_high=cfg.clip_eps_high,
        updates_per_step=cfg.updates_per_step,
        minibatches=cfg.steps_per_rollout,
        micro_batch_size=cfg.micro_batch_size,
        weight_decay=cfg.weight_decay,
        adam_betas=(cfg.adam_beta1, cfg.adam_beta2),
        kl_coef=cfg.kl_coef,
        kl_loss_type=cfg.kl_loss_type,
        advantage_estimator=cfg.advantage_estimator,
        per_token_loss=cfg.per_token_loss,
    )


def stage_model(cfg: LocalStageConfig, texts: Sequence[str] = ()) -> Path:
    """What every local stage does first: its output folder, torch threads, seeds, and its model folder.

    ``texts``: extra training text for the tiny model's tokenizer (see :func:`tokenizer_texts`).
    """
    import torch

    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    shape = TinyShape(cfg.tiny_vocab_size, cfg.tiny_hidden_size, cfg.tiny_layers)
    return prepare_model(cfg.model_source, out, cfg.seed, shape, texts)


async def tokenizer_texts(cfg: LocalStageConfig) -> list[str]:
    """The warm-start records' prompts and gold turns, when the stage builds the tiny model and warm-starts it.

    The tiny tokenizer learns its merges from them, as a real tokenizer is trained on text like what
    its model reads: sequences get shorter (cheaper steps) and a name the model must copy from a
    passage is a few tokens, not a dozen characters. The held-out records are not among them.
    """
    if cfg.model_source != TINY_MODEL or not cfg.warm_start_steps or not cfg.warm_start_demos:
        return []
    # Only the records are needed: no engine runs yet, so any URL in the env's settings stays unused.
    env = get_environment(cfg.env, bind_engine(cfg.env_config, "http://127.0.0.1:0", cfg.served_name))
    try:
        records = stage_records(env, cfg).warm_start
    finally:
        await env.aclose()
    turns_of = load_demo_turns(str(cfg.warm_start_demos))
    texts: list[str] = []
    for record in records:
        prompt = record["prompt"]
        texts += [prompt if isinstance(prompt, str) else json.dumps(prompt), *turns_of(record)]
    return texts


@dataclass
class ServedStage:
    """The engine serving the stage's model, its URL, and the rollout context every phase uses."""

    engine: LocalEngine
    url: str
    model_dir: Path
    context: RolloutContext

    @property
    def env(self) -> Any:
        """The stage's own env (the context's instance: one per tag)."""
        return self.context.env(next(iter(self.context.env_configs)))


@contextlib.asynccontextmanager
async def served_stage(cfg: LocalStageConfig, model_dir: Path) -> AsyncIterator[ServedStage]:
    """The engine on ``model_dir`` and one rollout context for it: the stage's env and the replayed envs,
    their settings bound to the engine, budgets as the recipe says. On exit the context (its envs and HTTP
    session) is closed, on this loop, before the engine stops."""
    engine = LocalEngine(
        MultiLoraModel.from_pretrained(model_dir, seed=cfg.seed, settings=cfg.engine_settings),
        served_name=cfg.served_name,
    )
    async with engine.serve(cfg.engine_host, cfg.engine_port) as url:
        context = RolloutContext(
            engine_url=url,
            load_chat=functools.partial(load_chat_tokens, str(model_dir)),
            budgets=Budgets(max_response_len=cfg.max_response_len, mode=cfg.response_budget),
            env_configs=stage_env_configs(cfg, url),
        )
        try:
            yield ServedStage(engine, url, model_dir, context)
        finally:
            await context.aclose()


async def serve_policy(cfg: LocalStageConfig, stage: ServedStage, trainer: PolicyTrainer, loaded: bool) -> None:
    """Put the trainer's policy on the engine: the adapter (swapped in, requests of every tag the stage runs
    go to it), or with full fine-tuning the weights, in place."""
    if trainer.full:
        trainer.sync_weights(stage.engine.model.base)
        return
    trainer.save(cfg.adapter_dir)
    checksum = adapter_checksum(cfg.adapter_dir)  # the engine checks the files it reads against it
    await swap_adapter(
        [stage.context.client()],
        cfg.expert_name,
        cfg.adapter_dir,
        checksum=checksum,
        engine_verifies=True,
        loaded=loaded,
    )
    stage.context.experts = ExpertTable.from_mapping({tag: cfg.expert_name for tag in stage.context.env_configs})


def check_parity(trainer: PolicyTrainer, batch: list[Any]) -> dict[str, float]:
    """The stage's parity check: the engine's log-probs of the batch against the trainer's recompute; a gap
    above :data:`~aclarena_slime.parity.LOCAL_TOLERANCE` stops the stage before the first update."""
    report = parity.require(
        parity.compare(
            [s.rollout_log_probs for s in batch],
            trainer.recompute_log_probs(batch),
            [s.loss_mask for s in batch],
            parity.LOCAL_TOLERANCE,
        )
    )
    return {"parity_mean_abs": report.mean_abs, "parity_max_abs": report.max_abs}


async def grpo_phase(cfg: LocalStageConfig, stage: ServedStage, trainer: PolicyTrainer) -> dict[str, Any]:
    """Evaluate, then ``steps`` GRPO steps (the monitor watching earlier domains), then evaluate again."""
    await serve_policy(cfg, stage, trainer, loaded=False)
    split = stage_records(stage.env, cfg)
    train = replay_mixture(cfg, split.train, stage.context.env_configs)  # the replay baseline (else as is)
    stream, limit = PromptStream(train), asyncio.Semaphore(cfg.max_concurrency)
    held_out, sampled = in_stage(cfg, split), cfg.eval_temperature > 0
    validating = split.validation if cfg.validation_eval else []  # the validation prompts evaluated
    steps: list[dict[str, Any]] = []
    monitor = StageMonitor.for_stage(
        bind_engine(cfg.monitor, stage.url, cfg.served_name),
        stage.url,
        stage.model_dir,
        None if trainer.full else cfg.expert_name,
        cfg.policy_dir,
    )  # None: no earlier domain to watch
    with _progress(cfg.progress) as progress:
        task = progress.add_task(f"{cfg.env}: evaluating", total=cfg.steps + 2)
        before = await evaluate(stage.context, held_out, cfg, limit)
        before_greedy = await evaluate(stage.context, held_out, cfg, limit, greedy=True) if sampled else None
        validation = [await validate(stage.context, validating, cfg, limit, 0)] if validating else []
        progress.advance(task)
        keep_on_disk = trainer.full and monitor is not None and monitor.keeps_policy  # a LoRA policy always is
        if keep_on_disk:
            trainer.save(cfg.policy_dir)
        if monitor:
            await monitor.check(0)
        for step in range(cfg.steps):
            t0 = time.monotonic()
            rolled = await sample_step(stage.context, stream, cfg, limit)
            batch = [to_train_sample(s) for group in rolled.kept for s in group if s.usable]
            # The parity check on the first batch with tokens to compare (step 0 unless it had none).
            unchecked = not any("parity_mean_abs" in record for record in steps)
            tokens = any(sum(s.loss_mask) for s in batch)
            checked = await asyncio.to_thread(check_parity, trainer, batch) if unchecked and tokens else {}
            stats = await asyncio.to_thread(trainer.step, batch)
            await serve_policy(cfg, stage, trainer, loaded=True)  # the real backend's sync: unload, then load
            if keep_on_disk:
                trainer.save(cfg.policy_dir)
            steps.append(
                {
                    "step": step,
                    **rollout_figures([s for group in rolled.rolled_out for s in group]),
                    **(rolled.figures() if cfg.dynamic_sampling else {}),
                    **stats,
                    **checked,
                    "seconds": round(time.monotonic() - t0, 3),
                }
            )
            progress.update(
                task,
                advance=1,
                description=f"{cfg.env}: step {step + 1}/{cfg.steps} reward {steps[-1]['reward_mean']:.3f}",
            )
            if cfg.progress:
                progress.console.print(step_line(steps[-1]))
            if monitor and await monitor.check(step + 1):
                break  # the monitor's action "stop": an earlier domain fell
            if validating and cfg.validation_interval and (step + 1) % cfg.validation_interval == 0:
                validation.append(await validate(stage.context, validating, cfg, limit, step + 1))
        if validating and validation[-1]["step"] != len(steps):
            validation.append(await validate(stage.context, validating, cfg, limit, len(steps)))
        after = await evaluate(stage.context, held_out, cfg, limit)
        after_greedy = await evaluate(stage.context, held_out, cfg, limit, greedy=True) if sampled else None
        progress.advance(task)
    if trainer.full:
        trainer.save(cfg.policy_dir)
    return {
        "eval_before": before,
        "eval_after": after,
        # Beside a sampled evaluation, the greedy one: RL trains on samples and may sharpen them towards what
        # greedy decoding already answered, which moves the sampled reward and not the greedy one.
        **({"eval_greedy": {"before": before_greedy, "after": after_greedy}} if sampled else {}),
        "steps": steps,
        **({"eval_validation": validation} if validation else {}),
        **({"monitor": monitor.report(len(steps))} if monitor else {}),
        "records": split.counts(),
    }


async def sft_phase(cfg: LocalStageConfig, stage: ServedStage, trainer: PolicyTrainer) -> dict[str, Any]:
    """An SFT warm-start stage: the starting policy's rollouts on the stage's prompts (the teacher), kept by
    the recipe's filter (the SFT data pipeline's rules), ``sft_epochs`` passes over what is kept, each in
    ``steps_per_rollout`` optimiser steps on contiguous parts (slime's global batch, as a GRPO step takes it)."""
    await serve_policy(cfg, stage, trainer, loaded=False)
    split = stage_records(stage.env, cfg)
    limit = asyncio.Semaphore(cfg.max_concurrency)
    before = await evaluate(stage.context, in_stage(cfg, split), cfg, limit)
    teacher = await rollout_step(stage.context, split.train, cfg, 0, limit)
    kept, report = keep(teacher, cfg.env, sft_filter(cfg))
    examples = rollout_examples(kept)
    steps = []
    for epoch in range(cfg.sft_epochs if examples else 0):
        for start, end in contiguous_parts(len(examples), cfg.steps_per_rollout):
            stats = await asyncio.to_thread(trainer.sft_step, examples[start:end])
            steps.append({"epoch": epoch, "samples": float(end - start), **stats})
    await serve_policy(cfg, stage, trainer, loaded=True)
    after = await evaluate(stage.context, in_stage(cfg, split), cfg, limit)
    if trainer.full:
        trainer.save(cfg.policy_dir)
    return {
        "teacher_rollouts": len(teacher),
        "kept": len(kept),
        "filter": report.to_dict().get(cfg.env, {}),
        "eval_before": before,
        "eval_after": after,
        "steps": steps,
        "records": split.counts(),
    }


def sft_filter(cfg: LocalStageConfig) -> MixtureSettings:
    """The recipe's ``aclarena_sft_filter`` as the SFT data pipeline's settings (its own one conversion)."""
    if cfg.sft_filter is None:
        raise LocalStageError("an SFT stage needs custom.aclarena_sft_filter (min_reward, statuses, max_tokens)")
    return cfg.sft_filter.mixture()


def keep(samples: Sequence[Sample], domain: str, settings: MixtureSettings) -> tuple[list[Sample], Any]:
    """The samples the warm-start filter keeps (the SFT data pipeline's own rules), in order."""
    from aclarena_slime.distill.dumps import episode_from_record
    from aclarena_slime.distill.sdft import build_mixture

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


def rollout_examples(samples: Sequence[Sample]) -> list[SftExample]:
    """Rollouts as SFT examples: the prompt is context, the mask-1 response tokens are trained."""
    return [
        SftExample(list(s.tokens), [0] * (len(s.tokens) - s.response_length) + list(s.loss_mask))
        for s in samples
        if s.response_length > 0 and sum(s.loss_mask or []) > 0 and len(s.tokens) > s.response_length
    ]


# Settings of the phases after the warm start (and the output folder, which holds it): a stage that differs
# from the last run in its output folder only in these reuses the warm-started backbone there
# (``warm_start_model/``, with WARM_START_RECORD).
AFTER_WARM_START = frozenset(
    {
        "kind", "sft_filter", "sft_epochs", "full_finetune", "weight_decay",
        "adam_beta1", "adam_beta2", "steps", "prompts_per_step", "samples_per_prompt", "lr", "temperature",
        "top_p", "lora", "updates_per_step", "clip_eps_low", "clip_eps_high", "engine_host", "engine_port",
        "max_concurrency", "progress", "monitor", "base_adapter", "output_dir", "validation_size",
        "validation_interval", "validation_eval", "group_filter", "over_sampling_prompts", "filter_settings",
        "max_sampling_rounds", "steps_per_rollout",
    }
)  # fmt: skip
WARM_START_RECORD = "warm_start.json"


def warm_start_key(cfg: LocalStageConfig) -> str:
    """What the warm-started backbone depends on (every setting but :data:`AFTER_WARM_START`), as one string."""
    return json.dumps({k: v for k, v in cfg.to_dict().items() if k not in AFTER_WARM_START}, sort_keys=True)


def cached_warm_start(cfg: LocalStageConfig) -> dict[str, Any] | None:
    """The warm start's report when ``warm_start_dir`` holds one made with these settings, else None."""
    record = cfg.warm_start_dir / WARM_START_RECORD
    try:
        saved = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return saved.get("warm_start") if saved.get("key") == warm_start_key(cfg) else None


async def warm_start_phase(cfg: LocalStageConfig, model_dir: Path) -> tuple[Path, dict[str, Any]]:
    """Evaluate the base model, build SFT examples from the env's gold demos, fine-tune: the new backbone.

    A warm start already in the output folder with the same settings (and seed) is reused: the runs that
    change only the RL settings skip its cost (``cached`` in the report)."""
    cached = cached_warm_start(cfg)
    if cached is not None:
        backbone = cfg.warm_start_dir.resolve()
        return backbone, {**cached, "backbone": str(backbone), "cached": True, "engine_generated_tokens": 0}
    before, examples, demos, generated = await warm_start_examples(cfg, model_dir)
    settings = warm_start_settings(cfg)
    (cfg.warm_start_dir / WARM_START_RECORD).unlink(missing_ok=True)  # a half-written backbone is never reused
    backbone, sft = await asyncio.to_thread(warm_start, model_dir, examples, settings, cfg.warm_start_dir, cfg.seed)
    report = {"eval_before": before, **demos, "sft": sft, "backbone": str(backbone)}
    write_json_atomic(backbone / WARM_START_RECORD, {"key": warm_start_key(cfg), "warm_start": report})
    return backbone, {**report, "cached": False, "engine_generated_tokens": generated}


async def policy_warm_start(cfg: LocalStageConfig, model_dir: Path, trainer: PolicyTrainer) -> dict[str, Any]:
    """The warm start into the stage's policy (``warm_start_target: policy``): the same SFT on the gold demos,
    on the trainer's parameters (a LoRA expert: the backbone stays as it is, shared by other experts)."""
    before, examples, demos, generated = await warm_start_examples(cfg, model_dir)
    settings = warm_start_settings(cfg)
    reference = trainer.reference if settings.kl_coef else None
    sft = await asyncio.to_thread(train_sft, trainer.model, examples, settings, trainer.pad_id, cfg.seed, reference)
    return {"eval_before": before, **demos, "sft": sft, "target": "policy", "cached": False,
            "engine_generated_tokens": generated}  # fmt: skip


def warm_start_settings(cfg: LocalStageConfig) -> SftSettings:
    """The warm start's SFT schedule (the recipe's ``cluster.local.warm_start_*``), the same for a backbone or an
    expert target, with the stage's KL term (``algorithm.use_kl_loss``: the KL anchor acts on the warm start too)."""
    return SftSettings(
        steps=cfg.warm_start_steps,
        batch_size=cfg.warm_start_batch_size,
        lr=cfg.warm_start_lr,
        micro_batch_size=cfg.micro_batch_size,
        kl_coef=cfg.kl_coef,
        kl_loss_type=cfg.kl_loss_type,
    )


def load_reference(model_dir: Path) -> Any:
    """The model in ``model_dir``, frozen: a KL reference."""
    import torch
    from transformers import AutoModelForCausalLM

    return frozen_copy(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))


async def warm_start_examples(
    cfg: LocalStageConfig, model_dir: Path
) -> tuple[Any, list[SftExample], dict[str, Any], int]:
    """The base model's held-out reward, the SFT examples, what went into them, and the tokens the engine generated.

    The examples are the env's gold demo trajectories (those scoring at least the warm start's bar); with the
    replay baseline (``cfg.replay``) the warm-start records are the replay mixture, the GRPO phase's mechanism
    and shares, of the stage's own records and the earlier domains' with gold demos, each replayed through its
    own env at its own stage's budget and bar. The report: ``demos`` (the own env's replay), and with replay
    ``replayed`` (each earlier env's) and ``mixed`` (the examples per env)."""
    replayed = dict(cfg.replay.get("warm_start") or {}) if cfg.replay.get("enabled") else {}
    async with served_stage(cfg, model_dir) as stage:
        records = stage_records(stage.env, cfg)
        with _progress(cfg.progress) as progress:
            task = progress.add_task(f"{cfg.env}: evaluating the base model", total=2)
            before = await evaluate(stage.context, in_stage(cfg, records), cfg, asyncio.Semaphore(cfg.max_concurrency))
            progress.update(task, advance=1, description=f"{cfg.env}: replaying gold demos")
            mixed = replay_mixture(
                cfg, records.warm_start, stage.context.env_configs, cfg.warm_start_batch_size, list(replayed)
            )
            by_env: dict[str, list[dict[str, Any]]] = {}
            for record in mixed:
                by_env.setdefault(record["metadata"]["env"], []).append(record)
            own = {"demos": cfg.warm_start_demos, "max_response_len": cfg.max_response_len,
                   "min_reward": cfg.warm_start_min_reward}  # fmt: skip
            examples: list[SftExample] = []
            reports: dict[str, dict[str, Any]] = {}
            for tag, tag_records in by_env.items():
                demos = own if tag == cfg.env else replayed[tag]
                env = stage.context.env(tag)
                best = env.reward_range[1] if demos.get("min_reward") is None else demos["min_reward"]
                tag_examples, replay = await demo_examples(
                    env,
                    stage.context.chat,
                    tag_records,
                    load_demo_turns(str(demos["demos"])),
                    Budgets(max_response_len=int(demos["max_response_len"]), mode=cfg.response_budget),
                    best,
                    _end_of_turn(stage.engine.model),
                )
                examples += tag_examples
                reports[tag] = {"records": len(tag_records), "examples": len(tag_examples), **replay.as_dict()}
            progress.advance(task)
    if not reports[cfg.env]["examples"]:
        raise LocalStageError(
            f"no gold demo trajectory of {cfg.warm_start_demos} scored at least the warm start's bar within "
            f"max_response_len={cfg.max_response_len} ({reports[cfg.env]}); nothing to warm-start on"
        )
    report: dict[str, Any] = {"demos": {k: v for k, v in reports[cfg.env].items() if k not in ("records", "examples")}}
    if replayed:
        report["mixed"] = {tag: r["examples"] for tag, r in reports.items()}
        report["replayed"] = {tag: r for tag, r in reports.items() if tag != cfg.env}
    return before, examples, report, stage.engine.generated_tokens


def _end_of_turn(model: MultiLoraModel) -> int:
    """The token that closes a model turn: the chat template's end-of-turn, else the first eos id."""
    tokenizer = model.tokenizer
    token = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    return int(token if token is not None else min(model.eos_ids))


async def rollout_step(
    context: RolloutContext, records: list[dict[str, Any]], cfg: LocalStageConfig, step: int, limit: asyncio.Semaphore
) -> list[Sample]:
    """``samples_per_prompt`` rollouts of each record (one GRPO group per record, numbered from the step's
    first), rewarded."""
    numbered = [(step * cfg.prompts_per_step + g, record) for g, record in enumerate(records)]
    return [s for group in await rollout_groups(context, numbered, cfg, limit) for s in group]


async def rollout_groups(
    context: RolloutContext, numbered: list[tuple[int, dict[str, Any]]], cfg: LocalStageConfig, limit: asyncio.Semaphore
) -> list[list[Sample]]:
    """One GRPO group of ``samples_per_prompt`` rewarded rollouts per ``(group number, record)``; sample ``k`` of
    group ``g`` is sample ``g * samples_per_prompt + k`` of the stage (its sampling seed)."""
    k = cfg.samples_per_prompt
    groups = [[new_sample(record, g, g * k + j) for j in range(k)] for g, record in numbered]
    params = {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_new_tokens": cfg.max_response_len}
    await _gather(context, [s for group in groups for s in group], params, cfg.seed, limit)
    return groups


async def sample_step(
    context: RolloutContext, stream: PromptStream, cfg: LocalStageConfig, limit: asyncio.Semaphore
) -> SampledStep:
    """A GRPO step's groups: ``prompts_per_step`` of them, or with the recipe's dynamic sampling the first that
    many its group filter keeps, over rounds of ``over_sampling_prompts`` (:mod:`~aclarena_slime.local.group_filter`)."""
    group_filter = GroupFilter.named(cfg.group_filter, cfg.filter_settings) if cfg.group_filter else None
    return await sample_groups(
        stream,
        functools.partial(rollout_groups, context, cfg=cfg, limit=limit),
        cfg.prompts_per_step,
        cfg.prompts_per_round,
        group_filter,
        cfg.max_sampling_rounds,
    )


async def evaluate(
    context: RolloutContext,
    records: list[dict[str, Any]],
    cfg: LocalStageConfig,
    limit: asyncio.Semaphore,
    greedy: bool = False,
) -> dict[str, Any]:
    """Mean reward of ``eval_samples`` rollouts per held-out record at ``eval_temperature`` (avg@n; greedy at 0),
    or with ``greedy`` of one greedy rollout per record. Sample ``j`` of record ``i`` has its own seed, the same
    whatever the policy, so two evaluations of one stage differ by the policy, not by the draw."""
    k = 1 if greedy else cfg.eval_samples
    if not records:
        return {"n": 0, "mean_reward": None, "excluded": 0, "prompts": 0, "samples_per_prompt": k}
    samples = [new_sample(r, i, i * k + j) for i, r in enumerate(records) for j in range(k)]
    params = {
        "temperature": 0.0 if greedy else cfg.eval_temperature,
        "top_p": 1.0 if greedy else cfg.eval_top_p,
        "max_new_tokens": cfg.eval_budget,
    }
    await _gather(context, samples, params, cfg.seed + HELD_OUT_SEED, limit)
    usable = [s for s in samples if s.usable]
    mean = statistics.fmean(s.reward for s in usable) if usable else None
    return {"n": len(usable), "mean_reward": mean, "excluded": len(samples) - len(usable), "prompts": len(records),
            "samples_per_prompt": k}  # fmt: skip


def in_stage(cfg: LocalStageConfig, records: StageRecords) -> list[dict[str, Any]]:
    """The held-out records the stage evaluates itself: none with ``stage_eval`` off (the arena's evaluator
    measures the stage's policy afterwards; the records stay out of training all the same)."""
    return records.evaluation if cfg.stage_eval else []


async def validate(
    context: RolloutContext, records: list[dict[str, Any]], cfg: LocalStageConfig, limit: asyncio.Semaphore, step: int
) -> dict[str, Any]:
    """The reward on the validation prompts after ``step`` GRPO steps, evaluated as the held-out prompts are: what
    settings are chosen on."""
    return {"step": step, **await evaluate(context, records, cfg, limit)}


async def _gather(
    context: RolloutContext, samples: list[Sample], params: dict[str, Any], seed: int, limit: asyncio.Semaphore
) -> None:
    """Roll out and score ``samples``; requests enter the engine in sample order, each with its own seed,
    so a run is reproducible whatever order the engine finishes them in."""

    async def one(sample: Sample) -> None:
        async with limit:
            await run_sample(context, sample, {**params, "sampling_seed": seed * 1_000_003 + int(sample.index or 0)})
            if sample.usable:
                sample.reward = await score_sample(context, sample)

    await asyncio.gather(*(one(s) for s in samples))


def step_line(step: dict[str, Any]) -> str:
    """One GRPO step's diagnostics on one line: what the rollouts scored, whether there was anything to
    learn from (groups with differing rewards), and how far the step moved the policy."""
    return (
        f"step {step['step']}: reward {step['reward_mean']:.3f}, groups with spread {step['groups_with_spread']:.2f}, "
        f"adv std {step['adv_std']:.2f}, entropy {step.get('entropy', 0.0):.2f}, "
        f"KL to start {step.get('kl_to_start', 0.0):.4f}, grad norm {step.get('grad_norm', 0.0):.2f}, "
        f"clip {step['clip_frac']:.3f}, truncated {step['truncated_frac']:.2f}"
    )


def to_train_sample(sample: Sample) -> TrainSample:
    return TrainSample(
        tokens=list(sample.tokens),
        response_length=sample.response_length,
        loss_mask=list(sample.loss_mask or []),
        rollout_log_probs=list(sample.rollout_log_probs or []),
        reward=float(sample.reward or 0.0),
        group=int(sample.group_index or 0),
    )


def rollout_figures(samples: list[Sample]) -> dict[str, float]:
    usable = [s for s in samples if s.usable]
    rewards = [float(s.reward or 0.0) for s in usable]
    return {
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "response_len_mean": statistics.fmean(s.response_length for s in usable) if usable else 0.0,
        "model_token_frac": sum(sum(s.loss_mask or []) for s in usable)
        / max(sum(s.response_length for s in usable), 1),
        "truncated_frac": sum(s.status is Sample.Status.TRUNCATED for s in usable) / max(len(usable), 1),
        "excluded": float(len(samples) - len(usable)),
    }


def prepare_model(source: str, out: Path, seed: int, shape: TinyShape | None = None, texts: Sequence[str] = ()) -> Path:
    """The model directory: the tiny model (of ``shape``, its tokenizer also trained on ``texts``) written
    into ``out/base_model``, or the user's HF directory."""
    if source == TINY_MODEL:
        return save_tiny_checkpoint(out / "base_model", with_model=True, seed=seed, shape=shape, texts=texts).resolve()
    path = Path(source).expanduser()
    if not (path / "config.json").is_file():
        raise LocalStageError(
            f"model {source!r} is neither 'tiny' nor a Hugging Face model directory (no config.json in it)"
        )
    return path.resolve()


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not enabled,
        transient=False,
        console=Console(stderr=True),  # stdout is for results (``--json``)
    )
