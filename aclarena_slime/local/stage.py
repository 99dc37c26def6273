"""One RL stage on the local backend: engine up, rollouts through the real rollout functions, LoRA steps.

:func:`run_stage` is what ``launch/stage.sh`` runs on a machine without slime or a GPU. The rollouts
go through :func:`aclarena_slime.slime_edge.rollout.generate` and :func:`~aclarena_slime.slime_edge.rollout.reward` over HTTP,
exactly as slime calls them, against the embedded engine; after each step the adapter is exported
and the engine reloads it. Output folder::

    base_model/        the tiny model, when model="tiny"
    warm_start_model/  the backbone after the SFT warm start, when there is one
    adapter/           the expert, a PEFT directory (its config points at the backbone it was trained on)
    metrics.json       settings, warm-start and per-step training figures, evaluation before and after

With a warm start (``warm_start_steps`` > 0) the stage has the paper's shape: the base model is
evaluated, fine-tuned in full on the env's gold demo trajectories (:mod:`.demos`, :mod:`.sft`), and
the LoRA expert is trained by GRPO on the result. ``eval_before`` is then the base model's reward,
``eval_warm_start`` the reward after SFT, ``eval_after`` the reward after GRPO; all three on the same
held-out records, which share no prompt with any training record.

In ``env_config``, the strings ``{local_engine}`` and ``{local_model}`` are replaced by the engine's
base URL and served model name, so an env service can use the engine (e.g. the retail user
simulator: ``base_url: "{local_engine}/v1"``, ``model: "{local_model}"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import statistics
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aclarena_slime.curriculum.replay import local_replay
from aclarena_slime.evaluation.monitor import StageMonitor
from aclarena_slime.jsonl import write_json_atomic
from aclarena_slime.local.config import TINY_MODEL, LocalStageConfig
from aclarena_slime.local.demos import demo_examples, load_demo_turns
from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.generation import MultiLoraModel
from aclarena_slime.local.records import Sample, demo_records, new_sample, read_jsonl, take
from aclarena_slime.local.sft import SftSettings, warm_start
from aclarena_slime.local.trainer import LoraTrainer, TrainSample, TrainSettings
from aclarena_slime.plugin.contract import Environment
from aclarena_slime.plugin.registry import get_environment
from aclarena_slime.rollout import load_chat_tokens
from aclarena_slime.sglang_client import SGLangClient
from aclarena_slime.slime_edge.rollout import close_context, generate, reward
from aclarena_slime.testing.tiny_model import TinyShape, save_tiny_checkpoint

EVAL_SEED_OFFSET = 10_007  # demo evaluation records come from another seed than the training ones


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
    model_dir = stage_model(cfg, await tokenizer_texts(cfg))
    warm: dict[str, Any] | None = None
    if cfg.warm_start_steps:
        model_dir, warm = await warm_start_phase(cfg, model_dir)
    settings = TrainSettings(
        lr=cfg.lr,
        temperature=cfg.temperature,
        clip_eps_low=cfg.clip_eps_low,
        clip_eps_high=cfg.clip_eps_high,
        updates_per_step=cfg.updates_per_step,
        micro_batch_size=cfg.micro_batch_size,
    )
    trainer = lora_trainer(cfg, model_dir, settings)
    adapter_dir = trainer.save(cfg.adapter_dir)
    async with served_stage(cfg, model_dir) as (engine, url, env):
        result = await _stage(cfg, url, env, model_dir, adapter_dir, trainer, engine)
    if warm is not None:
        result["eval_warm_start"] = result["eval_before"]
        result["eval_before"] = warm.pop("eval_before")
        result["warm_start"] = warm
    result["seconds"] = round(time.monotonic() - started, 2)
    result["engine_generated_tokens"] = engine.generated_tokens + (warm or {}).get("engine_generated_tokens", 0)
    write_json_atomic(cfg.metrics_path, result)
    return result


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


def lora_trainer(cfg: LocalStageConfig, model_dir: Path, settings: TrainSettings) -> LoraTrainer:
    """The stage's LoRA expert on ``model_dir`` (continuing ``cfg.base_adapter`` when set), with its optimiser."""
    return LoraTrainer.build(
        model_dir,
        settings,
        rank=cfg.lora.rank,
        alpha=cfg.lora.alpha,
        dropout=cfg.lora.dropout,
        target_modules=cfg.lora.hf_target_modules(),
        base_adapter=cfg.base_adapter,
        seed=cfg.seed,
    )


async def _stage(cfg, url, env, model_dir, adapter_dir, trainer, engine) -> dict[str, Any]:
    client = SGLangClient(url)
    name = cfg.expert_name
    await client.load_lora_adapter(name, str(adapter_dir))
    env_config = bind_engine(cfg.env_config, url, cfg.served_name)
    split = stage_records(env, cfg)
    train, evaluation = split.train, split.evaluation
    args = rollout_args(url, model_dir, cfg, env_config, name)
    train = local_replay(cfg, train, args, url)  # the replay baseline: earlier envs' records join (else as is)
    limit = asyncio.Semaphore(cfg.max_concurrency)
    steps: list[dict[str, Any]] = []
    monitor = StageMonitor.for_stage(cfg, url, model_dir, adapter_dir)  # None: no earlier domain to watch
    with _progress(cfg.progress) as progress:
        task = progress.add_task(f"{cfg.env}: evaluating", total=cfg.steps + 2)
        before = await evaluate(args, evaluation, cfg, limit)
        progress.advance(task)
        if monitor:
            await monitor.check(0)
        for step in range(cfg.steps):
            t0 = time.monotonic()
            records = train[step * cfg.prompts_per_step : (step + 1) * cfg.prompts_per_step]
            samples = await rollout_step(args, records, cfg, step, limit)
            stats = await asyncio.to_thread(trainer.step, [to_train_sample(s) for s in samples if s.usable])
            trainer.save(adapter_dir)
            await client.unload_lora_adapter(name)  # the real backend's sync: unload, then load again
            await client.load_lora_adapter(name, str(adapter_dir))
            steps.append(
                {"step": step, **rollout_figures(samples), **stats, "seconds": round(time.monotonic() - t0, 3)}
            )
            progress.update(
                task,
                advance=1,
                description=f"{cfg.env}: step {step + 1}/{cfg.steps} reward {steps[-1]['reward_mean']:.3f}",
            )
            if monitor and await monitor.check(step + 1):
                break  # the monitor's action "stop": an earlier domain fell
        after = await evaluate(args, evaluation, cfg, limit)
        progress.advance(task)
    return {
        "backend": "local",
        "env": cfg.env,
        "expert": name,
        "model_dir": str(model_dir),
        "adapter_dir": str(adapter_dir),
        "config": cfg.to_dict(),
        "eval_before": before,
        "eval_after": after,
        "steps": steps,
        **({"monitor": monitor.report(len(steps))} if monitor else {}),
        "records": split.counts(),
    }


@dataclass(frozen=True)
class StageRecords:
    """The stage's records: RL prompts, warm-start prompts and held-out evaluation prompts.

    No training record (RL or warm start) shares a prompt with an evaluation record: those found in
    the training source are dropped and counted in ``overlap_dropped``. Only when that would leave
    nothing to train on (an env with a handful of prompts) are they kept, with a warning and
    ``held_out`` False.
    """

    train: list[dict[str, Any]]
    warm_start: list[dict[str, Any]]
    evaluation: list[dict[str, Any]]
    overlap_dropped: int
    held_out: bool = True  # False: no training prompt was left once the evaluation prompts were taken out

    def counts(self) -> dict[str, int]:
        return {
            "train": len(self.train),
            "warm_start": len(self.warm_start),
            "evaluation": len(self.evaluation),
            "overlap_dropped": self.overlap_dropped,
            "held_out": self.held_out,
        }


def stage_records(env: Any, cfg: LocalStageConfig) -> StageRecords:
    """Evaluation records first (``eval_data_path`` or demo records of another seed), then training ones
    (``data_path`` or the env's demo records) without the evaluation prompts."""
    if cfg.eval_size == 0:
        evaluation: list[dict[str, Any]] = []
    elif cfg.eval_data_path:
        evaluation = read_jsonl(cfg.eval_data_path, cfg.env)[: cfg.eval_size]
    else:
        evaluation = demo_records(env, cfg.eval_size, cfg.seed + EVAL_SEED_OFFSET)
    held_out = {prompt_key(r) for r in evaluation}
    n_train = cfg.steps * cfg.prompts_per_step
    n_warm = cfg.warm_start_records if cfg.warm_start_steps else 0
    if cfg.data_path:
        source = read_jsonl(cfg.data_path, cfg.env)
    else:  # enough demo records that dropping the held-out prompts still leaves the ones asked for
        source = demo_records(env, max(n_train, n_warm) + len(evaluation), cfg.seed)
    pool = [r for r in source if prompt_key(r) not in held_out]
    disjoint = bool(pool)
    if not disjoint:  # an env with a handful of prompts (a test env): train on them, and say so loudly
        warnings.warn(
            f"every training prompt of env {cfg.env!r} is also an evaluation prompt: the evaluation is not held out",
            stacklevel=2,
        )
        pool = list(source)
    rng = random.Random(cfg.seed)
    train = take(pool, n_train, rng) if cfg.data_path else pool[:n_train]
    if len(train) < n_train:  # a finite demo set: go through it again
        train = take(pool, n_train, rng)
    warm = take(pool, n_warm, random.Random(cfg.seed + 1)) if n_warm else []
    return StageRecords(train, warm, evaluation, len(source) - len(pool), disjoint)


def prompt_key(record: dict[str, Any]) -> str:
    """What makes two records the same question for the held-out split: their prompt."""
    return json.dumps(record.get("prompt"), sort_keys=True)


def rollout_args(
    url: str, model_dir: Path, cfg: LocalStageConfig, env_config: dict[str, Any], expert: str | None
) -> Any:
    """The slime-style ``args`` the rollout functions read (``expert`` None: the backbone, no adapter)."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return SimpleNamespace(
        sglang_router_ip=host,
        sglang_router_port=int(port),
        hf_checkpoint=str(model_dir),
        rollout_max_response_len=cfg.max_response_len,
        aclarena_response_budget=cfg.response_budget,
        aclarena_env_config={cfg.env: env_config},
        aclarena_experts={cfg.env: expert} if expert else {},
    )


@contextlib.asynccontextmanager
async def served_stage(cfg: LocalStageConfig, model_dir: Path) -> AsyncIterator[tuple[LocalEngine, str, Environment]]:
    """The engine on ``model_dir`` and the stage's env bound to it; on exit the env and the rollout
    context (the rollouts' envs and HTTP session) are closed, on this loop, before the engine stops."""
    model = MultiLoraModel.from_pretrained(model_dir, seed=cfg.seed, settings=cfg.engine_settings)
    engine = LocalEngine(model, served_name=cfg.served_name)
    async with engine.serve(cfg.engine_host, cfg.engine_port) as url:
        env = get_environment(cfg.env, bind_engine(cfg.env_config, url, cfg.served_name))
        try:
            yield engine, url, env
        finally:
            try:
                await env.aclose()
            finally:
                await close_context()


async def warm_start_phase(cfg: LocalStageConfig, model_dir: Path) -> tuple[Path, dict[str, Any]]:
    """Evaluate the base model, build SFT examples from the env's gold demos, fine-tune: the new backbone."""
    async with served_stage(cfg, model_dir) as (engine, url, env):
        records = stage_records(env, cfg)
        with _progress(cfg.progress) as progress:
            task = progress.add_task(f"{cfg.env}: evaluating the base model", total=2)
            args = rollout_args(url, model_dir, cfg, bind_engine(cfg.env_config, url, cfg.served_name), None)
            before = await evaluate(args, records.evaluation, cfg, asyncio.Semaphore(cfg.max_concurrency))
            progress.update(task, advance=1, description=f"{cfg.env}: replaying gold demos")
            chat = load_chat_tokens(str(model_dir))
            best = env.reward_range[1] if cfg.warm_start_min_reward is None else cfg.warm_start_min_reward
            examples, replay = await demo_examples(
                env,
                chat,
                records.warm_start,
                load_demo_turns(str(cfg.warm_start_demos)),
                cfg.max_response_len,
                best,
                _end_of_turn(engine.model),
            )
            progress.advance(task)
    if not examples:
        raise LocalStageError(
            f"no gold demo trajectory of {cfg.warm_start_demos} scored at least {best} within "
            f"max_response_len={cfg.max_response_len} ({replay.as_dict()}); nothing to warm-start on"
        )
    settings = SftSettings(
        steps=cfg.warm_start_steps,
        batch_size=cfg.warm_start_batch_size,
        lr=cfg.warm_start_lr,
        micro_batch_size=cfg.micro_batch_size,
    )
    backbone, sft = await asyncio.to_thread(warm_start, model_dir, examples, settings, cfg.warm_start_dir, cfg.seed)
    return backbone, {
        "eval_before": before,
        "demos": replay.as_dict(),
        "sft": sft,
        "backbone": str(backbone),
        "engine_generated_tokens": engine.generated_tokens,
    }


def _end_of_turn(model: MultiLoraModel) -> int:
    """The token that closes a model turn: the chat template's end-of-turn, else the first eos id."""
    tokenizer = model.tokenizer
    token = tokenizer.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tokenizer.get_vocab() else None
    return int(token if token is not None else min(model.eos_ids))


async def rollout_step(
    args: Any, records: list[dict[str, Any]], cfg: LocalStageConfig, step: int, limit: asyncio.Semaphore
) -> list[Sample]:
    """``samples_per_prompt`` rollouts of each record (one GRPO group per record), rewarded."""
    samples = []
    for g, record in enumerate(records):
        group = step * cfg.prompts_per_step + g
        samples += [
            new_sample(record, group, group * cfg.samples_per_prompt + k) for k in range(cfg.samples_per_prompt)
        ]
    params = {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_new_tokens": cfg.max_response_len}
    await _gather(samples, lambda s: _one(args, s, params, cfg.seed), limit)
    return samples


async def evaluate(
    args: Any, records: list[dict[str, Any]], cfg: LocalStageConfig, limit: asyncio.Semaphore
) -> dict[str, Any]:
    """Mean reward of one rollout per held-out record (greedy unless ``eval_temperature`` > 0)."""
    if not records:
        return {"n": 0, "mean_reward": None, "excluded": 0}
    samples = [new_sample(r, i, i) for i, r in enumerate(records)]
    params = {"temperature": cfg.eval_temperature, "top_p": cfg.eval_top_p, "max_new_tokens": cfg.eval_budget}
    await _gather(samples, lambda s: _one(args, s, params, cfg.seed + EVAL_SEED_OFFSET), limit)
    usable = [s for s in samples if s.usable]
    mean = statistics.fmean(s.reward for s in usable) if usable else None
    return {"n": len(usable), "mean_reward": mean, "excluded": len(samples) - len(usable)}


async def _one(args: Any, sample: Sample, params: dict[str, Any], seed: int) -> None:
    # A seed per sample keeps runs reproducible whatever order the engine serves requests in.
    params = {**params, "sampling_seed": seed * 1_000_003 + int(sample.index or 0)}
    await generate(args, sample, params)
    if sample.usable:
        sample.reward = await reward(args, sample)


async def _gather(samples: list[Sample], fn: Callable[[Sample], Awaitable[None]], limit: asyncio.Semaphore) -> None:
    async def bounded(sample: Sample) -> None:
        async with limit:
            await fn(sample)

    await asyncio.gather(*(bounded(s) for s in samples))


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


def bind_engine(config: Mapping[str, Any], url: str, served_name: str) -> dict[str, Any]:
    """``config`` with ``{local_engine}`` / ``{local_model}`` in its strings replaced (nested too)."""

    def bind(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{local_engine}", url).replace("{local_model}", served_name)
        if isinstance(value, Mapping):
            return {k: bind(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [bind(v) for v in value]
        return value

    return bind(dict(config))


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
