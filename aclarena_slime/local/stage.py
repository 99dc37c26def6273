"""The local backend's one runner: phases warm start | SFT | GRPO over one served engine and one rollout context.

:func:`run_stage` is what ``launch/stage.sh`` runs on a machine without slime or a GPU (the stage recipe, read
once by :func:`~aclarena_slime.local.session.open_session` into the parts the phases take; :mod:`aclarena_slime.local.spec`
says what it refuses).
The rollouts go through the shared rollout (:func:`~aclarena_slime.rollout.run_sample`,
:func:`~aclarena_slime.rollout.score_sample`) over HTTP against the embedded engine, with a
:class:`~aclarena_slime.rollout.RolloutContext` built here from the stage's settings. Phases:

- warm start (``warm_start_steps`` > 0; the paper's Base -> SFT -> RL shape): the base model is evaluated,
  fine-tuned in full on the env's gold demo trajectories (:mod:`.demos`, :mod:`.sft`); the result is the
  backbone of the rest of the stage.
- SFT (``kind="sft"``, a warm-start recipe): the starting policy's rollouts (the teacher), filtered by the
  recipe's ``aclarena_sft_filter`` with the SFT data pipeline's own rules, train the policy by cross-entropy.
- GRPO (``kind="rl"``): rollouts, group-normalised rewards, PPO-clipped steps, optionally a KL term to the
  starting policy; after each step the policy is synced to the engine. One loop (:func:`grpo_loop`) trains one
  expert or N side by side (parallel MLE, :mod:`.parallel_mle`); rollouts and evaluations are :mod:`.rollouts`.

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
import copy
import dataclasses
import functools
import hashlib
import json
import os
import random
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aclarena_slime import parity
from aclarena_slime.adapter_swap import files_checksum, swap_adapter
from aclarena_slime.evaluation.monitor import StageMonitor
from aclarena_slime.experts import ExpertTable
from aclarena_slime.jsonl import write_json_atomic
from aclarena_slime.local.config import TINY_MODEL
from aclarena_slime.local.demos import demo_examples, load_demo_turns
from aclarena_slime.local.engine import LocalEngine, open_engine
from aclarena_slime.local.group_filter import PromptStream, SampledStep
from aclarena_slime.local.records import (
    RecordSettings,
    Sample,
    StageRecords,
    bind_engine,
    replay_mixture,
    stage_env_configs,
    stage_records,
)
from aclarena_slime.local.rollouts import (
    Sampling,
    StepSampling,
    evaluate,
    in_stage,
    progress_bar,
    rollout_figures,
    rollout_step,
    sample_step,
    step_line,
    to_train_sample,
    validate,
)
from aclarena_slime.local.session import (
    EngineParts,
    LocalSession,
    LoopSettings,
    ModelSource,
    SftStage,
    WarmStart,
)
from aclarena_slime.local.sft import SftExample, frozen_copy, train_sft, warm_start
from aclarena_slime.local.tiny_model import TinyShape, save_tiny_checkpoint
from aclarena_slime.local.trainer import (
    PolicyTrainer,
    TrainSample,
    contiguous_parts,
    publish_folder,
    staging_folder,
)
from aclarena_slime.plugin.registry import get_environment
from aclarena_slime.rollout import Budgets, RolloutContext, load_chat_tokens
from aclarena_slime.sglang_client import SGLangClient

if TYPE_CHECKING:  # the SFT phase's filter: imported when an SFT stage runs
    from aclarena_slime.distill.sdft import MixtureSettings


class LocalStageError(RuntimeError):
    """The stage cannot run as configured (model folder, data); the message says what to change."""


def run_stage(session: LocalSession) -> dict[str, Any]:
    """Run the stage (its :func:`~aclarena_slime.local.session.open_session`); returns the metrics (also written to
    ``session.paths.metrics_path``)."""
    if session.loop.progress:  # one progress bar, ours: transformers' own bars would interleave with it
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return asyncio.run(run_session(session))


async def run_session(session: LocalSession) -> dict[str, Any]:
    """The stage's phases over its parts: the model folder, the warm start (when there is one), the policy, the
    SFT or GRPO phase on one served engine; the metrics."""
    started = time.monotonic()
    paths, policy, warm_start = session.paths, session.policy, session.warm_start
    model_dir = start_dir = stage_model(session.model, paths.output_dir, session.seed, await tokenizer_texts(session))
    warm: dict[str, Any] | None = None
    if warm_start is not None and not warm_start.into_policy:
        model_dir, warm = await warm_start_phase(session, model_dir)
    trainer = PolicyTrainer.build(model_dir, policy.train, policy.lora, policy.base_adapter, session.seed)
    if policy.train.loss.kl.coef and policy.full and model_dir != start_dir:
        # The KL anchor's reference is the policy the stage starts from, in the GRPO phase as in the warm start
        # before it, not the warm-started model.
        trainer.reference = load_reference(start_dir)
    if warm_start is not None and warm_start.into_policy:
        warm = await policy_warm_start(session, model_dir, trainer)
    env_configs = functools.partial(stage_env_configs, session.records)
    async with served_stage(session.engine, model_dir, session.seed, env_configs) as stage:
        phase = sft_phase if session.kind == "sft" else grpo_phase
        result = await phase(session, stage, trainer)
        generated = await stage.generated_tokens()
    result = {
        "backend": "local",
        "kind": session.kind,
        "env": session.env,
        "seed": session.seed,
        "expert": None if policy.full else policy.name,
        "model_dir": str(model_dir),
        **({"policy_dir": str(paths.policy_dir)} if policy.full else {"adapter_dir": str(paths.adapter_dir)}),
        "config": dict(session.settings),
        **result,
    }
    if warm is not None:
        result["eval_warm_start"] = result["eval_before"]
        result["eval_before"] = warm.pop("eval_before")
        result["warm_start"] = warm
    result["seconds"] = round(time.monotonic() - started, 2)
    result["engine_generated_tokens"] = generated + (warm or {}).get("engine_generated_tokens", 0)
    write_json_atomic(paths.metrics_path, result)
    return result


def stage_model(model: ModelSource, out: Path, seed: int, texts: Sequence[str] = ()) -> Path:
    """What every local stage does first: its output folder, torch threads, seeds, and its model folder.

    ``texts``: extra training text for the tiny model's tokenizer (see :func:`tokenizer_texts`).
    """
    import torch

    out.mkdir(parents=True, exist_ok=True)
    if model.torch_threads:
        torch.set_num_threads(model.torch_threads)
    random.seed(seed)
    torch.manual_seed(seed)
    return prepare_model(model.source, out, seed, model.shape, texts)


async def tokenizer_texts(session: LocalSession) -> list[str]:
    """The warm-start records' prompts and gold turns, when the stage builds the tiny model and warm-starts it.

    The tiny tokenizer learns its merges from them, as a real tokenizer is trained on text like what
    its model reads: sequences get shorter (cheaper steps) and a name the model must copy from a
    passage is a few tokens, not a dozen characters. The held-out records are not among them.
    """
    warm = session.warm_start
    if session.model.source != TINY_MODEL or warm is None or not warm.demos:
        return []
    records = (await offline_records(session.records, session.engine.served_name)).warm_start
    turns_of = load_demo_turns(str(warm.demos))
    texts: list[str] = []
    for record in records:
        prompt = record["prompt"]
        texts += [prompt if isinstance(prompt, str) else json.dumps(prompt), *turns_of(record)]
    return texts


async def offline_records(settings: RecordSettings, served_name: str) -> StageRecords:
    """The stage's records, read before any engine runs (any URL in the env's settings stays unused)."""
    env = get_environment(settings.env, bind_engine(settings.env_config, "http://127.0.0.1:0", served_name))
    try:
        return stage_records(env, settings)
    finally:
        await env.aclose()


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

    async def generated_tokens(self) -> int:
        """The tokens the engine has generated, as its ``/server_info`` says (``internal_states``): the stage reads
        the engine through its HTTP API, as it would read SGLang."""
        info = await self.context.client().get("/server_info")
        return int(info["internal_states"][0]["generated_tokens"])


@contextlib.asynccontextmanager
async def served_stage(
    engine_parts: EngineParts,
    model_dir: Path,
    seed: int,
    env_configs: Callable[[str, str], dict[str, dict[str, Any]]],
    experts: ExpertTable | None = None,
) -> AsyncIterator[ServedStage]:
    """The engine on ``model_dir`` (:func:`~aclarena_slime.local.engine.open_engine`), seeded with the stage's
    ``seed``, and one rollout context for it: the envs ``env_configs`` gives for the engine's URL and served name
    (a stage's: its env and the replayed ones,
    :func:`~aclarena_slime.local.records.stage_env_configs`), their settings bound to the engine, budgets as the
    recipe says. On exit the context (its envs and HTTP session) is closed, on this loop, before the engine stops."""
    engine = open_engine(
        model_dir, seed=seed, settings=engine_parts.settings, served_name=engine_parts.served_name
    )
    async with engine.serve(engine_parts.host, engine_parts.port) as url:
        context = RolloutContext(
            engine_url=url,
            load_chat=functools.partial(load_chat_tokens, str(model_dir)),
            budgets=engine_parts.budgets,
            env_configs=env_configs(url, engine_parts.served_name),
            experts=experts,
        )
        try:
            yield ServedStage(engine, url, model_dir, context)
        finally:
            await context.aclose()


async def serve_policy(stage: ServedStage, trainer: PolicyTrainer, name: str, folder: Path, loaded: bool) -> None:
    """Put the trainer's policy on the engine: the adapter (written to ``folder``, swapped in as ``name``, requests
    of every tag the stage runs go to it), or with full fine-tuning the weights, in place."""
    if trainer.full:
        stage.engine.update_weights(trainer.model.state_dict())
        return
    await publish_adapter(stage.context.client(), name, folder, adapter_files(trainer.model), loaded)
    stage.context.experts = ExpertTable.from_mapping({tag: name for tag in stage.context.env_configs})


def adapter_files(model: Any, adapter: str = "default") -> dict[str, bytes]:
    """The PEFT folder of ``model``'s adapter ``adapter``, as its files' bytes made from the tensors in memory."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save

    tensors = get_peft_model_state_dict(model, adapter_name=adapter)
    config = copy.copy(model.peft_config[adapter])
    config.inference_mode = True  # as PEFT's save_pretrained writes it
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        settings = (Path(tmp) / "adapter_config.json").read_bytes()
    weights = save({k: v.detach().contiguous() for k, v in tensors.items()}, metadata={"format": "pt"})
    return {"adapter_model.safetensors": weights, "adapter_config.json": settings}


async def publish_adapter(
    client: SGLangClient, name: str, folder: Path, files: Mapping[str, bytes], loaded: bool
) -> None:
    """Write an adapter's ``files`` into ``folder`` (replaced whole) and swap it in on the engine as ``name``
    (unload, then load, when ``loaded``). The checksum the engine checks is taken of ``files``, the bytes meant
    for the disk, so a file cut short on its way there is refused, never served."""
    checksum = files_checksum(files)
    await asyncio.to_thread(write_folder, folder, files)
    await swap_adapter([client], name, folder, checksum=checksum, engine_verifies=True, loaded=loaded)


def write_folder(directory: Path, files: Mapping[str, bytes]) -> None:
    """Put a folder holding ``files`` (name -> bytes) in place of ``directory``, whole (written aside, synced,
    then renamed into place)."""
    staging = staging_folder(Path(directory))
    staging.mkdir()
    for name, content in files.items():
        with open(staging / name, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
    publish_folder(staging, Path(directory))


def check_parity(recompute: Callable[[list[TrainSample]], list[list[float]]], batch: list[Any]) -> dict[str, float]:
    """The stage's parity check: the engine's log-probs of the batch against the trainer's recompute; a gap
    above :data:`~aclarena_slime.parity.LOCAL_TOLERANCE` stops the stage before the first update."""
    report = parity.require(
        parity.compare(
            [s.rollout_log_probs for s in batch],
            recompute(batch),
            [s.loss_mask for s in batch],
            parity.LOCAL_TOLERANCE,
        )
    )
    return {"parity_mean_abs": report.mean_abs, "parity_max_abs": report.max_abs}


@dataclass
class Expert:
    """One policy the GRPO loop trains: one for a stage, N side by side for parallel MLE (:mod:`.parallel_mle`).

    ``train`` takes one GRPO step on a batch, ``recompute`` gives the trainer's log-probs of a batch (the parity
    check), ``publish(loaded)`` puts the policy on the engine (``loaded``: replacing the one served), ``save``
    writes the policy after each step where the monitor reads it from disk; ``records`` and ``loop``: its records' and
    its GRPO loop's settings."""

    records: RecordSettings
    loop: LoopSettings
    train: Callable[[list[TrainSample]], dict[str, float]]
    recompute: Callable[[list[TrainSample]], list[list[float]]]
    publish: Callable[[bool], Awaitable[None]]
    save: Callable[[], Any] | None = None
    monitor: StageMonitor | None = None


async def grpo_phase(session: LocalSession, stage: ServedStage, trainer: PolicyTrainer) -> dict[str, Any]:
    """Evaluate, then ``steps`` GRPO steps (the monitor watching earlier domains), then evaluate again."""
    policy, paths = session.policy, session.paths
    monitor = stage_monitor(
        bind_engine(session.monitor, stage.url, session.engine.served_name),
        stage.url,
        stage.model_dir,
        None if trainer.full else policy.name,
        paths.policy_dir,
    )  # None: no earlier domain to watch
    keep_on_disk = trainer.full and monitor is not None and monitor.keeps_policy  # a LoRA policy always is
    expert = Expert(
        session.records,
        session.loop,
        trainer.step,
        trainer.recompute_log_probs,
        functools.partial(serve_policy, stage, trainer, policy.name, paths.adapter_dir),
        functools.partial(trainer.save, paths.policy_dir) if keep_on_disk else None,
        monitor,
    )
    [result] = await grpo_loop(stage.context, [expert])
    if trainer.full:
        trainer.save(paths.policy_dir)
    return result


def stage_monitor(
    values: Mapping[str, Any], url: str, model_dir: Path, adapter_name: str | None, policy_dir: Path
) -> StageMonitor | None:
    """The stage's forgetting monitor (None: no earlier domain to watch), its suite's stage-bound datasets bound by
    the recipes' stage reader (:func:`~aclarena_slime.recipes.compiler.read_stage`), as the slime backend's are."""
    return StageMonitor.for_stage(values, url, model_dir, adapter_name, policy_dir, stages=_read_stage)


def _read_stage(stage: str, env: str) -> Any:
    """:func:`~aclarena_slime.recipes.compiler.read_stage`, its compiler loaded when a suite names a stage."""
    from aclarena_slime.recipes.compiler import read_stage

    return read_stage(stage, env)


@dataclass
class _Run:
    """An expert's records and what the loop has measured of it so far."""

    expert: Expert
    split: StageRecords
    stream: PromptStream
    limit: asyncio.Semaphore
    held_out: list[dict[str, Any]]
    validating: list[dict[str, Any]]
    sampling: StepSampling
    evaluation: Sampling
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    validation: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stopped: bool = False

    @property
    def seed(self) -> int:
        """The expert's stage's seed: its draws'."""
        return self.expert.records.seed


async def grpo_loop(context: RolloutContext, experts: Sequence[Expert]) -> list[dict[str, Any]]:
    """The one GRPO loop, over one expert or N on one engine: each is evaluated (sampled, greedy beside a sampled
    evaluation, validation), then step by step every expert's groups are rolled out together and each takes its
    own step (the parity check on its first batch with tokens), is published and checked by its monitor; each is
    evaluated again at the end. Returns each expert's figures, in order."""
    runs = []
    for expert in experts:
        records, loop = expert.records, expert.loop
        await expert.publish(False)
        split = stage_records(context.env(records.env), records)
        # the replay baseline's mixture (without it, the records as they are)
        train = replay_mixture(records, split.train, context.env_configs, loop.sampling.prompts_per_step)
        validating = split.validation if loop.validation_eval else []  # the validation prompts evaluated
        runs.append(_Run(expert, split, PromptStream(train), asyncio.Semaphore(loop.max_concurrency),
                         in_stage(split, loop.stage_eval), validating, loop.sampling, loop.evaluation))  # fmt: skip
    first = experts[0].loop
    total = max(e.loop.steps for e in experts)
    with progress_bar(first.progress) as progress:
        task = progress.add_task(f"{'+'.join(e.records.env for e in experts)}: evaluating", total=total + 2)
        before = await asyncio.gather(*(_evaluations(context, run, 0) for run in runs))
        progress.advance(task)
        for run in runs:
            if run.expert.save:
                run.expert.save()
            if run.expert.monitor:
                await run.expert.monitor.check(0)
        for step in range(total):
            active = [run for run in runs if step < run.expert.loop.steps and not run.stopped]
            if not active:
                break
            t0 = time.monotonic()
            rolled = await asyncio.gather(
                *(sample_step(context, run.stream, run.sampling, run.seed, run.limit) for run in active)
            )
            for run, sampled in zip(active, rolled, strict=True):
                await _train_step(run, sampled, step)
            for run in active:
                run.steps[-1]["seconds"] = round(time.monotonic() - t0, 3)
            progress.update(task, advance=1, description=", ".join(
                f"{run.expert.records.env}: step {step + 1}/{run.expert.loop.steps} reward {run.steps[-1]['reward_mean']:.3f}"
                for run in active))  # fmt: skip
            for run in active:
                env, interval = run.expert.records.env, run.expert.loop.validation_interval
                if first.progress:
                    progress.console.print(("" if len(runs) == 1 else f"{env} ") + step_line(run.steps[-1]))
                if run.expert.monitor and await run.expert.monitor.check(step + 1):
                    run.stopped = True  # the monitor's action "stop": an earlier domain fell
                elif run.validating and interval and (step + 1) % interval == 0:
                    validated = await validate(context, run.validating, run.evaluation, run.seed, run.limit, step + 1)
                    run.validation.append(validated)
        for run in runs:
            if run.validating and run.validation[-1]["step"] != len(run.steps):
                run.validation.append(await validate(context, run.validating, run.evaluation, run.seed, run.limit,
                                                     len(run.steps)))  # fmt: skip
        after = await asyncio.gather(*(_evaluations(context, run) for run in runs))
        progress.advance(task)
    return [_figures(run, b, a) for run, b, a in zip(runs, before, after, strict=True)]


async def _evaluations(
    context: RolloutContext, run: _Run, validation_step: int | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The expert's held-out reward (and the greedy one beside a sampled evaluation); with ``validation_step``,
    its validation reward too."""
    sampling = run.evaluation
    sampled = await evaluate(context, run.held_out, sampling, run.seed, run.limit)
    greedy = None
    if sampling.temperature > 0:
        greedy = await evaluate(context, run.held_out, sampling, run.seed, run.limit, greedy=True)
    if validation_step is not None and run.validating:
        run.validation.append(await validate(context, run.validating, sampling, run.seed, run.limit, validation_step))
    return sampled, greedy


async def _train_step(run: _Run, sampled: SampledStep, step: int) -> None:
    """One expert's GRPO step on its groups: the parity check on its first batch with tokens, the update, the
    policy published (the real backend's sync: unload, then load) and saved where the monitor reads it."""
    expert = run.expert
    batch = [to_train_sample(s) for group in sampled.kept for s in group if s.usable]
    unchecked = not any("parity_mean_abs" in record for record in run.steps)
    tokens = any(sum(s.loss_mask) for s in batch)
    checked = await asyncio.to_thread(check_parity, expert.recompute, batch) if unchecked and tokens else {}
    stats = await asyncio.to_thread(expert.train, batch)
    await expert.publish(True)
    if expert.save:
        expert.save()
    run.steps.append(
        {
            "step": step,
            **rollout_figures([s for group in sampled.rolled_out for s in group]),
            **(sampled.figures() if expert.loop.dynamic_sampling else {}),
            **stats,
            **checked,
        }
    )


def _figures(
    run: _Run, before: tuple[dict[str, Any], dict[str, Any] | None], after: tuple[dict[str, Any], dict[str, Any] | None]
) -> dict[str, Any]:
    sampled = run.evaluation.temperature > 0
    return {
        "eval_before": before[0],
        "eval_after": after[0],
        # Beside a sampled evaluation, the greedy one: RL trains on samples and may sharpen them towards what
        # greedy decoding already answered, which moves the sampled reward and not the greedy one.
        **({"eval_greedy": {"before": before[1], "after": after[1]}} if sampled else {}),
        "steps": run.steps,
        **({"eval_validation": run.validation} if run.validation else {}),
        **({"monitor": run.expert.monitor.report(len(run.steps))} if run.expert.monitor else {}),
        "records": run.split.counts(),
    }


async def sft_phase(session: LocalSession, stage: ServedStage, trainer: PolicyTrainer) -> dict[str, Any]:
    """An SFT warm-start stage: the starting policy's rollouts on the stage's prompts (the teacher), kept by
    the recipe's filter (the SFT data pipeline's rules), ``sft.epochs`` passes over what is kept, each in
    ``sft.steps_per_epoch`` optimiser steps on contiguous parts (slime's global batch, as a GRPO step takes it)."""
    policy, paths, loop, sft = session.policy, session.paths, session.loop, session.sft
    await serve_policy(stage, trainer, policy.name, paths.adapter_dir, loaded=False)
    split = stage_records(stage.env, session.records)
    limit = asyncio.Semaphore(loop.max_concurrency)
    held_out = in_stage(split, loop.stage_eval)
    before = await evaluate(stage.context, held_out, loop.evaluation, session.seed, limit)
    teacher = await rollout_step(stage.context, split.train, loop.sampling, 0, session.seed, limit)
    kept, report = keep(teacher, session.env, sft_filter(sft))
    examples = rollout_examples(kept)
    steps = []
    for epoch in range(sft.epochs if examples else 0):
        for start, end in contiguous_parts(len(examples), sft.steps_per_epoch):
            stats = await asyncio.to_thread(trainer.sft_step, examples[start:end])
            steps.append({"epoch": epoch, "samples": float(end - start), **stats})
    await serve_policy(stage, trainer, policy.name, paths.adapter_dir, loaded=True)
    after = await evaluate(stage.context, held_out, loop.evaluation, session.seed, limit)
    if trainer.full:
        trainer.save(paths.policy_dir)
    return {
        "teacher_rollouts": len(teacher),
        "kept": len(kept),
        "filter": report.to_dict().get(session.env, {}),
        "eval_before": before,
        "eval_after": after,
        "steps": steps,
        "records": split.counts(),
    }


def sft_filter(sft: SftStage) -> MixtureSettings:
    """The recipe's ``aclarena_sft_filter`` as the SFT data pipeline's settings (its own one conversion)."""
    if sft.filter is None:
        raise LocalStageError("an SFT stage needs custom.aclarena_sft_filter (min_reward, statuses, max_tokens)")
    return sft.filter.mixture()


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


WARM_START_RECORD = "warm_start.json"  # in the warm-started backbone's folder: its key and report


def warm_start_key(session: LocalSession, records: StageRecords) -> str:
    """What the warm-started backbone and its report are made of, as one string: the SFT settings, the records it
    trains on and the held-out ones it reports on (their content, so a changed data file is a new warm start),
    the env and its gold demos, the model it starts from, the seed, and what sets its numerics (threads, the
    engine's batches). A setting it does not read (the RL phase's) does not enter it."""
    warm, loop, engine, model = _warm(session), session.loop, session.engine, session.model
    records_digest = hashlib.sha256(
        json.dumps([records.warm_start, in_stage(records, loop.stage_eval)], sort_keys=True, default=str).encode()
    ).hexdigest()
    evaluation, replay = loop.evaluation, session.records.replay
    consumed = {
        "sft": dataclasses.asdict(warm.sft),
        "records": records_digest,
        "env": [session.env, session.records.env_config],
        "demos": [warm.demos, warm.min_reward, engine.budgets.max_response_len, engine.budgets.mode],
        "replay": replay if replay.get("enabled") else None,
        "evaluation": [evaluation.samples, evaluation.temperature, evaluation.top_p, evaluation.max_new_tokens,
                       loop.stage_eval],  # fmt: skip
        "model": [model.source, model.shape.vocab_size, model.shape.hidden_size, model.shape.num_layers],
        "seed": session.seed,
        "numerics": [model.torch_threads, dataclasses.asdict(engine.settings), loop.max_concurrency],
    }
    return json.dumps(consumed, sort_keys=True, default=str)


def _warm(session: LocalSession) -> WarmStart:
    if session.warm_start is None:
        raise LocalStageError("the stage has no warm start (cluster.local.warm_start_steps is 0)")
    return session.warm_start


async def cached_warm_start(session: LocalSession, key: str | None = None) -> dict[str, Any] | None:
    """The warm start's report when ``warm_start_dir`` holds one made of the same (:func:`warm_start_key`; ``key``
    when already taken), else None."""
    record = session.paths.warm_start_dir / WARM_START_RECORD
    try:
        saved = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if key is None:
        key = warm_start_key(session, await offline_records(session.records, session.engine.served_name))
    return saved.get("warm_start") if saved.get("key") == key else None


async def warm_start_phase(session: LocalSession, model_dir: Path) -> tuple[Path, dict[str, Any]]:
    """Evaluate the base model, build SFT examples from the env's gold demos, fine-tune: the new backbone.

    A warm start already in the output folder with the same settings (and seed) is reused: the runs that
    change only the RL settings skip its cost (``cached`` in the report)."""
    key = warm_start_key(session, await offline_records(session.records, session.engine.served_name))
    cached = await cached_warm_start(session, key)
    folder = session.paths.warm_start_dir
    if cached is not None:
        backbone = folder.resolve()
        return backbone, {**cached, "backbone": str(backbone), "cached": True, "engine_generated_tokens": 0}
    before, examples, demos, generated = await warm_start_examples(session, model_dir)
    (folder / WARM_START_RECORD).unlink(missing_ok=True)  # a half-written backbone is never reused
    backbone, sft = await asyncio.to_thread(warm_start, model_dir, examples, _warm(session).sft, folder, session.seed)
    report = {"eval_before": before, **demos, "sft": sft, "backbone": str(backbone)}
    write_json_atomic(backbone / WARM_START_RECORD, {"key": key, "warm_start": report})
    return backbone, {**report, "cached": False, "engine_generated_tokens": generated}


async def policy_warm_start(session: LocalSession, model_dir: Path, trainer: PolicyTrainer) -> dict[str, Any]:
    """The warm start into the stage's policy (``warm_start_target: policy``): the same SFT on the gold demos,
    on the trainer's parameters (a LoRA expert: the backbone stays as it is, shared by other experts). Its SFT
    schedule is the recipe's ``cluster.local.warm_start_*`` with the stage's KL term (``algorithm.use_kl_loss``:
    the KL anchor acts on the warm start too), as for a backbone target."""
    before, examples, demos, generated = await warm_start_examples(session, model_dir)
    settings = _warm(session).sft
    reference = trainer.reference if settings.kl.coef else None
    sft = await asyncio.to_thread(train_sft, trainer.model, examples, settings, trainer.pad_id, session.seed, reference)
    return {"eval_before": before, **demos, "sft": sft, "target": "policy", "cached": False,
            "engine_generated_tokens": generated}  # fmt: skip


def load_reference(model_dir: Path) -> Any:
    """The model in ``model_dir``, frozen: a KL reference."""
    import torch
    from transformers import AutoModelForCausalLM

    return frozen_copy(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))


async def warm_start_examples(
    session: LocalSession, model_dir: Path
) -> tuple[Any, list[SftExample], dict[str, Any], int]:
    """The base model's held-out reward, the SFT examples, what went into them, and the tokens the engine generated.

    The examples are the env's gold demo trajectories (those scoring at least the warm start's bar); with the
    replay baseline (the records' ``replay``) the warm-start records are the replay mixture, the GRPO phase's
    mechanism and shares, of the stage's own records and the earlier domains' with gold demos, each replayed
    through its own env at its own stage's budget and bar. The report: ``demos`` (the own env's replay), and with
    replay ``replayed`` (each earlier env's) and ``mixed`` (the examples per env)."""
    warm, loop, settings, budgets, env_tag = _warm(session), session.loop, session.records, session.engine.budgets, session.env
    replayed = dict(settings.replay.get("warm_start") or {}) if settings.replay.get("enabled") else {}
    env_configs = functools.partial(stage_env_configs, settings)
    async with served_stage(session.engine, model_dir, session.seed, env_configs) as stage:
        records = stage_records(stage.env, settings)
        with progress_bar(loop.progress) as progress:
            task = progress.add_task(f"{env_tag}: evaluating the base model", total=2)
            held_out, limit = in_stage(records, loop.stage_eval), asyncio.Semaphore(loop.max_concurrency)
            before = await evaluate(stage.context, held_out, loop.evaluation, session.seed, limit)
            progress.update(task, advance=1, description=f"{env_tag}: replaying gold demos")
            mixed = replay_mixture(
                settings, records.warm_start, stage.context.env_configs, warm.sft.batch_size, list(replayed)
            )
            by_env: dict[str, list[dict[str, Any]]] = {}
            for record in mixed:
                by_env.setdefault(record["metadata"]["env"], []).append(record)
            own = {"demos": warm.demos, "max_response_len": budgets.max_response_len, "min_reward": warm.min_reward}
            examples: list[SftExample] = []
            reports: dict[str, dict[str, Any]] = {}
            for tag, tag_records in by_env.items():
                demos = own if tag == env_tag else replayed[tag]
                env = stage.context.env(tag)
                best = env.reward_range[1] if demos.get("min_reward") is None else demos["min_reward"]
                tag_examples, replay = await demo_examples(
                    env,
                    stage.context.chat,
                    tag_records,
                    load_demo_turns(str(demos["demos"])),
                    Budgets(max_response_len=int(demos["max_response_len"]), mode=budgets.mode),
                    best,
                )
                examples += tag_examples
                reports[tag] = {"records": len(tag_records), "examples": len(tag_examples), **replay.as_dict()}
            progress.advance(task)
        generated = await stage.generated_tokens()
    if not reports[env_tag]["examples"]:
        raise LocalStageError(
            f"no gold demo trajectory of {warm.demos} scored at least the warm start's bar within "
            f"max_response_len={budgets.max_response_len} ({reports[env_tag]}); nothing to warm-start on"
        )
    report: dict[str, Any] = {"demos": {k: v for k, v in reports[env_tag].items() if k not in ("records", "examples")}}
    if replayed:
        report["mixed"] = {tag: r["examples"] for tag, r in reports.items()}
        report["replayed"] = {tag: r for tag, r in reports.items() if tag != env_tag}
    return before, examples, report, generated


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
