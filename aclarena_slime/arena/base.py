"""The arena's local parts: its shared base model (the tiny model lightly fine-tuned once on every domain's
gold demos) and the evaluation of a stage's policy on the local engine: the arena's own use of the local backend
(the curriculum reaches a backend only through the stage launcher).

The paper's methods all start from one model (Qwen3-8B-Base). On a CPU that model is the tiny one, its
tokenizer trained on every domain's warm-start text, then fine-tuned in full for a few steps on the gold demo
trajectories of every domain that has them (the local backend's warm start, all domains mixed in one SFT
run): the output format, not the answers, which each stage's own warm start teaches. It is built once per
seed and reused by every method: a method's difference from another is then only what its stages train.
Domains without gold demos (retail) add nothing to it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aclarena_slime.evaluation.suite import EvalSuite
from aclarena_slime.jsonl import write_json_atomic
from aclarena_slime.local.config import TINY_MODEL
from aclarena_slime.local.demos import demo_examples, load_demo_turns
from aclarena_slime.local.records import bind_engine, stage_records
from aclarena_slime.local.session import LocalSession
from aclarena_slime.local.sft import SftExample, SftSettings, warm_start
from aclarena_slime.local.stage import prepare_model, tokenizer_texts
from aclarena_slime.plugin.registry import get_environment
from aclarena_slime.rollout import load_chat_tokens

MODEL_DIR = "model"  # inside the base's folder: the warm-started model (a Hugging Face folder)
REPORT = "base.json"
SERVED = "local"  # the engine's served model name ({local_model} in an env's settings, e.g. retail's user)


@dataclass
class BaseSettings:
    """The shared warm start: SFT steps over every domain's gold demos mixed, and the records per domain."""

    steps: int = 100
    records: int = 256  # gold demo records per domain
    lr: float = 3.0e-3
    batch_size: int = 16

    def __post_init__(self) -> None:
        if min(self.steps, self.records, self.batch_size) < 1 or self.lr <= 0:
            raise ValueError(f"base: steps, records and batch_size must be positive and lr > 0, got {self}")


def build_base(sessions: Sequence[LocalSession], settings: BaseSettings, out: Path, seed: int) -> Path:
    """The base model for ``seed`` in ``out`` (built when absent, else reused); ``sessions``: one per domain with
    gold demos, its stage's session with the base's warm start (``settings``' steps and records) and ``seed``
    (:func:`~aclarena_slime.arena.runner.run_arena` builds them)."""
    model = out / MODEL_DIR
    if (model / "config.json").is_file() and (out / REPORT).is_file():
        built = json.loads((out / REPORT).read_text())
        if built.get("settings") != dataclasses.asdict(settings) or built.get("seed") != seed:
            raise ValueError(
                f"{out} holds a base built with {built.get('settings')} (seed {built.get('seed')}), not "
                f"{dataclasses.asdict(settings)} (seed {seed}): choose another output_dir or remove it"
            )
        return model.resolve()
    print(f"[arena] building the shared base model (seed {seed}) in {out}", file=sys.stderr)
    if not sessions:
        raise ValueError("the arena's base needs at least one domain with gold demos (cluster.local.warm_start_demos)")
    if any(s.model.source != TINY_MODEL for s in sessions):
        raise ValueError("the arena's base is built from the tiny model (cluster.local.model=tiny in every stage)")
    first = sessions[0]
    if first.model.torch_threads:  # as a local stage runs (1 is fastest for the tiny model)
        import torch

        torch.set_num_threads(first.model.torch_threads)
    texts = [t for s in sessions for t in asyncio.run(tokenizer_texts(s))]
    start = prepare_model(TINY_MODEL, out, seed, sessions[0].model.shape, texts)
    examples: list[SftExample] = []
    replays: dict[str, Any] = {}
    for session in sessions:
        found, report = asyncio.run(_examples(session, start))
        examples += found
        replays[session.env] = report
    train = first.policy.train
    sft = SftSettings(steps=settings.steps, batch_size=settings.batch_size, lr=settings.lr, backprop=train.backprop,
                      kl=dataclasses.replace(train.loss.kl, coef=0.0))  # the base has no anchor  # fmt: skip
    backbone, report = warm_start(start, examples, sft, model, seed)
    write_json_atomic(out / REPORT, {"seed": seed, "settings": dataclasses.asdict(settings), "demos": replays,
                                     "sft": report})  # fmt: skip
    return Path(backbone).resolve()


async def _examples(session: LocalSession, model_dir: Path) -> tuple[list[SftExample], dict[str, Any]]:
    """The gold demo trajectories of the session's env (its warm-start records), as the stage's warm start makes
    them."""
    records, warm = session.records, session.warm_start
    if warm is None:  # build_base gives each domain with gold demos the base's warm start
        raise ValueError(f"the arena's base: domain {records.env!r} has no warm start")
    config = bind_engine(records.env_config, "http://127.0.0.1:0", session.engine.served_name)
    env = get_environment(records.env, config)
    try:
        chat = load_chat_tokens(str(model_dir))
        best = env.reward_range[1] if warm.min_reward is None else warm.min_reward
        examples, report = await demo_examples(
            env,
            chat,
            stage_records(env, records).warm_start,
            load_demo_turns(str(warm.demos)),
            session.engine.budgets,
            best,
        )
    finally:
        await env.aclose()
    return examples, report.as_dict()


async def evaluate_policy(
    suite: EvalSuite, model: Path, experts: str | None, out: Path, stage: str, seed: int, memo: Path | None = None
) -> Path:
    """Serve ``model`` (and the experts of the ``experts`` manifest) on the local engine; run ``suite``.

    With ``memo`` (a folder), a dataset whose weights, settings and seed were evaluated before is copied from it
    instead of rolled out (:mod:`aclarena_slime.evaluation.memo`); ``memo.json`` in ``out`` lists which were."""
    from aclarena_slime.evaluation.memo import EvalMemo, folder_digest
    from aclarena_slime.evaluation.runner import SAMPLES_DIR, RunSettings, load_experts, run_suite
    from aclarena_slime.experts import ExpertTable
    from aclarena_slime.local.engine import open_engine
    from aclarena_slime.local.records import bind_engine
    from aclarena_slime.sglang_client import SGLangClient, new_session

    table = ExpertTable.load(experts) if experts else None
    keys: dict[str, str] = {}
    reused: list[str] = []
    kept = EvalMemo(memo) if memo is not None else None
    if kept is not None:
        weights = folder_digest(model)
        for d in suite.datasets:
            expert = table.experts.get(d.env) if table is not None else None
            routed = [folder_digest(expert.path)] if expert is not None and expert.path is not None else []
            keys[d.name] = kept.key(d, [weights, *routed], seed)
            if kept.restore(keys[d.name], out / SAMPLES_DIR / f"{d.name}.jsonl"):
                reused.append(d.name)
    engine = open_engine(model, seed=seed, served_name=SERVED)
    async with engine.serve() as url, new_session() as session:
        client = SGLangClient(url, session=session)
        if table is not None:
            await load_experts(client, table)
        bound = EvalSuite(suite.name, tuple(dataclasses.replace(d, env_config=bind_engine(d.env_config, url, SERVED))
                                            for d in suite.datasets))  # fmt: skip
        settings = RunSettings(out_dir=out, stage=stage, concurrency=64, resume=True, save_tokens=False,
                               base_for_missing_expert=True)  # fmt: skip
        summary = await run_suite(bound, client, engine.tokenizer, settings, table)
    if kept is not None:
        for name, key in keys.items():
            if name not in reused:
                kept.keep(key, out / SAMPLES_DIR / f"{name}.jsonl", summary["datasets"][name])
        write_json_atomic(out / "memo.json", {"memo": str(memo), "keys": keys, "reused": reused})
    return out / "summary.json"
