"""Running a suite against any endpoint that speaks SGLang's ``/generate``: one JSON line per sample.

The same agent loop as training (:func:`aclarena_slime.agent_loop.run_episode`), so an eval episode
is exactly a rollout: same prompt rendering, same env, same scoring. With an expert table, every
request of a dataset carries ``lora_path`` = the expert of the dataset's env tag (SGLang multi-LoRA,
the router, or the local engine all honour it).

Nothing is lost on failure: each sample's line is written (and flushed) as soon as it is scored; a
run that stopped because the endpoint went away resumes with ``resume=True`` and redoes only what is
missing. An existing result folder is never overwritten without ``resume``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from aclarena_slime.adapter_swap import load_adapters
from aclarena_slime.agent_loop import FAILED, Trajectory, run_episode
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.evaluation.records import read_tasks
from aclarena_slime.evaluation.suite import HELD_OUT_SEED, EvalDataset, EvalSuite, SuiteError
from aclarena_slime.evaluation.summary import build_summary, latest_by_key, summarize_dataset
from aclarena_slime.experts import ExpertTable, UnknownExpert
from aclarena_slime.jsonl import write_json_atomic
from aclarena_slime.plugin.contract import Environment, Task
from aclarena_slime.plugin.registry import get_environment
from aclarena_slime.rollout import Budgets, loop_settings
from aclarena_slime.sglang_client import SGLangClient, SGLangError

SAMPLES_DIR = "samples"
SUMMARY_FILE = "summary.json"


class ResultsExist(FileExistsError):
    pass


@dataclass(frozen=True)
class RunSettings:
    out_dir: Path
    data_root: Path | None = None
    stage: str | None = None  # recorded in the summary: the row of the forgetting matrix
    concurrency: int = 32
    resume: bool = False
    save_tokens: bool = True  # prompt/response ids and loss mask per sample (the entropy analysis reads them)
    base_for_missing_expert: bool = False  # a domain with no expert runs on the base model instead of failing


@dataclass
class _Plan:
    dataset: EvalDataset
    tasks: list[Task]
    lora_path: str | None
    done: set[tuple[int, int]]


async def run_suite(
    suite: EvalSuite,
    client: SGLangClient,
    tokenizer: Any,
    settings: RunSettings,
    experts: ExpertTable | None = None,
    progress: Any = None,
    model_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate every dataset of ``suite``; writes ``samples/<dataset>.jsonl`` and ``summary.json``.

    ``progress`` is a ``rich.progress.Progress`` (or None for silence). Returns the summary.
    """
    envs = {d.name: get_environment(d.env, d.env_config) for d in suite.datasets}  # the run's own; closed at its end
    plans = [_plan(d, settings, experts, envs[d.name]) for d in suite.datasets]
    samples_dir = settings.out_dir / SAMPLES_DIR
    if not settings.resume and any((samples_dir / f"{p.dataset.name}.jsonl").exists() for p in plans):
        raise ResultsExist(f"{samples_dir} already holds results; resume them or choose another output folder")
    samples_dir.mkdir(parents=True, exist_ok=True)
    semaphore = asyncio.Semaphore(max(1, settings.concurrency))
    files = {p.dataset.name: _open_append(samples_dir / f"{p.dataset.name}.jsonl") for p in plans}
    try:
        jobs = []
        for plan in plans:
            chat = ChatTokens(tokenizer, plan.dataset.chat_template_kwargs)
            bar = (
                progress.add_task(plan.dataset.name, total=len(plan.tasks) * plan.dataset.n_samples)
                if progress
                else None
            )
            if bar is not None:
                progress.advance(bar, len(plan.done))
            for index, task in enumerate(plan.tasks):
                for sample in range(plan.dataset.n_samples):
                    if (index, sample) in plan.done:
                        continue
                    job = _one(plan, envs[plan.dataset.name], task, index, sample, client, chat, settings, semaphore)
                    jobs.append(asyncio.ensure_future(_then_write(job, files[plan.dataset.name], progress, bar)))
        await _all_or_cancel(jobs)
    finally:
        for handle in files.values():
            handle.close()
        for env in envs.values():
            await env.aclose()
    results = {}
    for plan in plans:
        lines = _read_lines(samples_dir / f"{plan.dataset.name}.jsonl")
        results[plan.dataset.name] = summarize_dataset(plan.dataset, len(plan.tasks), lines, plan.lora_path)
    summary = build_summary(suite.name, settings.stage, results, model=dict(model_info or {}))
    write_json_atomic(settings.out_dir / SUMMARY_FILE, summary)
    return summary


async def load_experts(client: SGLangClient, experts: ExpertTable) -> list[str]:
    """Load every expert that has a path into the endpoint (one SGLang server with ``--enable-lora``, or
    the local engine), through the one adapter mechanism (:mod:`aclarena_slime.adapter_swap`); returns
    the adapter names loaded. Behind a router the router does this instead."""
    adapters = {e.adapter: str(e.path) for e in experts.experts.values() if e.path is not None}
    return await load_adapters([client], adapters)


def _plan(dataset: EvalDataset, settings: RunSettings, experts: ExpertTable | None, env: Environment) -> _Plan:
    if dataset.demo:
        records = env.demo_records(min(dataset.demo, dataset.limit or dataset.demo), seed=HELD_OUT_SEED)
        tasks = [Task(r["prompt"], r.get("label"), {**r.get("metadata", {}), "env": dataset.env}) for r in records]
    else:
        tasks = read_tasks(dataset.resolved_path(settings.data_root), dataset.env, dataset.limit, env.check_label)
    lora_path = None
    if experts is not None:
        try:
            lora_path = experts.adapter_for(dataset.env)
        except UnknownExpert as exc:
            if not settings.base_for_missing_expert:
                raise SuiteError(f"dataset {dataset.name!r}: {exc}") from None
    done: set[tuple[int, int]] = set()
    if settings.resume:  # only this run's (index, sample) keys: a smaller limit or n_samples ignores the rest
        lines = _read_lines(settings.out_dir / SAMPLES_DIR / f"{dataset.name}.jsonl")
        latest = latest_by_key(lines, len(tasks), dataset.n_samples)
        done = {key for key, line in latest.items() if line.get("reward") is not None}
    return _Plan(dataset, tasks, lora_path, done)


async def _one(
    plan: _Plan,
    env: Environment,
    task: Task,
    index: int,
    sample: int,
    client: SGLangClient,
    chat: ChatTokens,
    settings: RunSettings,
    semaphore: asyncio.Semaphore,
) -> dict[str, Any]:
    dataset = plan.dataset
    # The stage's budgets when the dataset reproduces one (suite.StageRollout): a per-turn budget stays per turn.
    budgets = Budgets(dataset.max_response_len, dataset.budget_mode, dataset.max_context_len)
    loop = loop_settings(budgets, {}, True, plan.lora_path, dataset.max_turns)
    async with semaphore:
        try:
            traj = await run_episode(env, task, client, chat, dataset.sampling_params(), loop)
        except SGLangError as exc:
            if exc.status is None:  # the endpoint is gone: stop the run; what is written stays
                raise
            traj = Trajectory(status=FAILED, end_reason="engine_error", error=str(exc))
    line: dict[str, Any] = {
        "dataset": dataset.name,
        "index": index,
        "sample": sample,
        "env": dataset.env,
        "domain": dataset.domain,
        "lora_path": plan.lora_path,
        "status": traj.status,
        "end": traj.end_reason,
        "reward": traj.score.reward if traj.score is not None else None,
        "breakdown": traj.score.breakdown if traj.score is not None else None,
        "label": task.label,
        "turns": traj.turns,
        "messages": traj.messages,  # the whole conversation: SDFT builds its SFT records from these
        "response_tokens": len(traj.response_ids),
    }
    if traj.tools:
        line["tools"] = traj.tools
    if traj.error:
        line["error"] = traj.error
    if settings.save_tokens:
        line.update(prompt_ids=traj.prompt_ids, response_ids=traj.response_ids, loss_mask=traj.loss_mask)
    return line


async def _then_write(job: Any, handle: TextIO, progress: Any, bar: Any) -> None:
    line = await job
    handle.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
    handle.flush()
    if bar is not None:
        progress.advance(bar)


async def _all_or_cancel(jobs: list[asyncio.Future]) -> None:
    try:
        await asyncio.gather(*jobs)
    except BaseException:
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        raise


def _open_append(path: Path) -> TextIO:
    """Append mode, first ending a line a crash may have cut short so the next record stands alone."""
    handle = path.open("a", encoding="utf-8")
    if handle.tell():
        with path.open("rb") as tail:
            tail.seek(-1, os.SEEK_END)  # only the last byte: result files grow large
            if tail.read(1) != b"\n":
                handle.write("\n")
    return handle


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = []
    with path.open(encoding="utf-8") as handle:
        for text in handle:
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                continue  # a line cut short by a crash: that sample is simply redone
    return lines
