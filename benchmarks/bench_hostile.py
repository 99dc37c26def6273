"""Hostile model turns through every env: escapes, slow calls, rewards out of range, refused writes that wrote.

    .venv/bin/python benchmarks/bench_hostile.py [--turns 10000] [--size 20000] [--retail-data DIR] [--env TAG ...]

Drives ``--turns`` hostile turns per env (the families of :mod:`aclarena_slime.plugin.hostile`, in turn, up to
``--size`` characters) two ways and prints a table per way:

- **contract**: ``start`` / ``step`` / ``score`` on the env object, each call timed on its own, in
  episodes of up to the env's turn limit (a ``score`` is timed with the episode's last turn);
- **rollout**: the slime-facing ``generate`` + ``reward`` with a fake SGLang engine (the tiny model's
  tokenizer) answering with the hostile turns; one call is one sample (all its turns and its score).

Columns: ``escapes`` (an exception out of a call; in the rollout a sample FAILED by the env, i.e. what
slime would remove), ``>1s`` (calls over one second), the slowest call and its input, rewards outside
the env's ``reward_range``, and for the customer-service env, turns whose every write was refused
that still changed the database. Retail needs τ³'s data folder (``--retail-data``; skipped without
it). Timings are wall-clock on whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aclarena_slime.local.tiny_model import save_tiny_checkpoint
from aclarena_slime.plugin import hostile, registry
from aclarena_slime.plugin.contract import Environment, Observation, Task
from aclarena_slime.slime_edge.rollout import close_context, generate, reward
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import FakeSample, make_args

ENVS = ("search", "retail", "ifeval", "mock", "template", "learnable", "math")
WRITE_TOOLS = (
    "cancel_pending_order",
    "modify_pending_order",
    "modify_user_address",
    "exchange_delivered_order_items",
    "return_delivered_order_items",
)

WARM_UP = [("warm-up", t) for t in ("Hello. This is fine.", "<answer>x</answer>", "\\boxed{1}", "<search>a</search>")]


@dataclass
class Tally:
    calls: int = 0
    escapes: dict[str, int] = field(default_factory=dict)
    slow: int = 0
    slowest: float = 0.0
    slowest_input: str = ""
    out_of_range: int = 0
    refused_but_wrote: int = 0
    loop_stall: float = 0.0  # the longest the event loop could not run anything else (rollout way)

    def time(self, seconds: float, text: str, what: str) -> None:
        self.calls += 1
        self.slow += seconds > 1.0
        if seconds > self.slowest:
            self.slowest, self.slowest_input = seconds, f"{what} {text[:40]!r}… ({len(text)} chars)"

    def escape(self, what: str) -> None:
        self.escapes[what] = self.escapes.get(what, 0) + 1

    def check_reward(self, env: Environment, value: Any) -> None:
        low, high = env.reward_range
        if not isinstance(value, (int, float)) or math.isnan(value) or not low <= value <= high:
            self.out_of_range += 1


def _config(tag: str, retail_data: str | None) -> dict[str, Any]:
    if tag == "retail":
        return {"data_dir": retail_data, "user": {"kind": "scripted", "replies": ["Hi."] * 1000}}
    return {}


def _tasks(env: Environment) -> list[Task]:
    return [Task(r["prompt"], r["label"], r.get("metadata", {})) for r in env.demo_records(4)]


def _db_state(episode: Any) -> str | None:
    """The customer-service env's database hash (None for other envs)."""
    tools = getattr(episode, "tools", None)
    if tools is None or not hasattr(tools, "db"):
        return None
    from aclarena_envs.retail.db import canonical_hash

    return canonical_hash(tools.db)


async def _timed(tally: Tally, what: str, text: str, awaitable: Any) -> tuple[bool, Any]:
    start = time.perf_counter()
    try:
        result = await awaitable
    except Exception as exc:  # noqa: BLE001 - counted, the point of the benchmark
        tally.time(time.perf_counter() - start, text, what)
        tally.escape(f"{what}:{type(exc).__name__}")
        return False, None
    tally.time(time.perf_counter() - start, text, what)
    return True, result


async def contract(env: Environment, turns: list[tuple[str, str]]) -> Tally:
    """Episodes of up to ``env.max_turns`` hostile turns (as the loop drives them), each call timed."""
    tally, tasks = Tally(), _tasks(env)
    queue, episodes = iter(turns), 0
    pending = next(queue, None)
    while pending is not None:
        text = pending[1]
        ok, episode = await _timed(tally, "start", text, env.start(tasks[episodes % len(tasks)]))
        episodes += 1
        if not ok:
            pending = next(queue, None)
            continue
        try:
            for _ in range(env.max_turns):
                writes = any(f'"name": "{name}' in text for name in WRITE_TOOLS)
                before = _db_state(episode) if writes else None
                ok, result = await _timed(tally, "step", text, episode.step(text))
                pending = next(queue, None)
                if before is not None and isinstance(result, Observation):
                    refused = all(str(m.get("content", "")).startswith("Error") for m in result.messages)
                    if refused and _db_state(episode) != before:
                        tally.refused_but_wrote += 1
                if not ok or not isinstance(result, Observation) or pending is None:
                    break
                text = pending[1]
            ok, score = await _timed(tally, "score", text, episode.score())
            if ok:
                tally.check_reward(env, score.reward)
        finally:
            await episode.close()
    return tally


async def rollout(
    tag: str, env: Environment, turns: list[tuple[str, str]], ckpt: Path, tokenizer: Any, config: dict
) -> Tally:
    tally, tasks = Tally(), _tasks(env)
    queue = iter(text for _, text in turns)
    last = {"text": ""}

    def reply(_request: dict[str, Any]) -> str:
        last["text"] = next(queue, "")
        return last["text"]

    monitor = asyncio.create_task(_watch_loop(tally))
    async with FakeSGLang(tokenizer, reply) as engine:
        args = make_args(ckpt, engine.host, engine.port, rollout_max_response_len=1 << 20, aclarena_env_config=config)
        i = 0
        while len(engine.requests) < len(turns):
            task = tasks[i % len(tasks)]
            sample = FakeSample(prompt=task.prompt, label=task.label, metadata={**task.metadata, "env": tag})
            start = time.perf_counter()
            try:
                sample = await generate(args, sample, {"temperature": 1.0})
                value = await reward(args, sample)
            except Exception as exc:  # noqa: BLE001
                tally.escape(f"generate:{type(exc).__name__}")
                break
            finally:
                tally.time(time.perf_counter() - start, last["text"], "sample")
            status = getattr(sample.status, "value", sample.status)
            if status == "failed":
                tally.escape(f"failed:{sample.metadata['aclarena'].get('end', '?')}")
            elif status != "aborted":
                tally.check_reward(env, value)
            i += 1
    monitor.cancel()
    await close_context()
    return tally


async def _watch_loop(tally: Tally, tick: float = 0.01) -> None:
    """Records the longest delay of a 10 ms sleep past its due time: the worst event-loop stall."""
    while True:
        due = time.perf_counter() + tick
        await asyncio.sleep(tick)
        tally.loop_stall = max(tally.loop_stall, time.perf_counter() - due)


def _table(title: str, rows: dict[str, Tally]) -> Table:
    table = Table(title=title)
    columns = ["env", "calls", "escapes", ">1s", "slowest s", "slowest input", "reward out of range", "refused+wrote"]
    stalls = any(t.loop_stall for t in rows.values())
    for column in columns + (["loop stall s"] if stalls else []):
        table.add_column(column)
    for tag, t in rows.items():
        escapes = ", ".join(f"{k}×{v}" for k, v in sorted(t.escapes.items())) or "0"
        table.add_row(
            tag,
            str(t.calls),
            escapes,
            str(t.slow),
            f"{t.slowest:.3f}",
            t.slowest_input,
            str(t.out_of_range),
            str(t.refused_but_wrote) if tag == "retail" else "-",
            *([f"{t.loop_stall:.3f}"] if stalls else []),
        )
    return table


def _progress(tag: str, way: str, results: dict[str, dict[str, Tally]], started: float) -> None:
    """One JSON line per env and way on stderr as soon as it is measured (a long run cut short keeps them)."""
    line = {"env": tag, "way": way, "seconds": round(time.perf_counter() - started, 1), **vars(results[way][tag])}
    print(json.dumps(line), file=sys.stderr, flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000, help="hostile turns per env and per way")
    parser.add_argument("--size", type=int, default=20_000, help="largest hostile turn, in characters")
    parser.add_argument("--retail-data", default=None, help="τ³-Retail data directory (retail is skipped without)")
    parser.add_argument("--env", action="append", choices=ENVS, help="only these envs (repeatable)")
    parser.add_argument("--skip-rollout", action="store_true", help="only the contract way")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    args = parser.parse_args()

    from aclarena_envs.template.env import TemplateEnvironment

    registry.register("template", TemplateEnvironment)
    tags = [t for t in (args.env or ENVS) if t != "retail" or args.retail_data]
    turns = hostile.random_turns(args.turns, size=args.size)
    ckpt = save_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="bench-hostile-")) / "tiny")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    results: dict[str, dict[str, Tally]] = {"contract": {}, "rollout": {}}
    for tag in tags:
        config = _config(tag, args.retail_data)
        env = registry.get_environment(tag, config)
        await contract(env, WARM_UP)  # first calls load models (Punkt, langdetect, indexes): not what is measured
        started = time.perf_counter()
        results["contract"][tag] = await contract(env, turns)
        _progress(tag, "contract", results, started)
        if not args.skip_rollout:
            await rollout(tag, env, WARM_UP, ckpt, tokenizer, {tag: config})
            started = time.perf_counter()
            results["rollout"][tag] = await rollout(tag, env, turns, ckpt, tokenizer, {tag: config})
            _progress(tag, "rollout", results, started)
        await env.aclose()
    if args.json:
        print(json.dumps({way: {tag: vars(t) for tag, t in rows.items()} for way, rows in results.items()}, indent=1))
        return
    console = Console(width=200)
    console.print(
        f"{args.turns} hostile turns per env, up to {args.size} characters"
        + ("" if args.retail_data else "; retail skipped (no --retail-data)")
    )
    for way, rows in results.items():
        if rows:
            console.print(
                _table(
                    f"{way}: start/step/score" if way == "contract" else f"{way}: generate + reward per sample", rows
                )
            )


if __name__ == "__main__":
    asyncio.run(main())
