"""``aclarena retail replay-gold``: replay every τ³-Retail task's gold actions through our tools and reward.

A self-check of the retail environment on the user's data: each task's gold actions are played as a
policy's tool calls through a fresh episode and scored by the env's reward; the final database hash is printed
(with ``--json``, one object per line: ``task_id``, ``reward``, ``db_hash``, ``errors``). The hash of
the untouched database is printed too, to compare with τ³'s own.
"""

from __future__ import annotations

import argparse
import json

from aclarena_slime.cli import CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    """The plugin's ``retail`` command; pyproject.toml registers it in the entry-point group ``aclarena_slime.cli``."""
    parser = subparsers.add_parser("retail", help="τ³-Retail tools: replay the gold actions", description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    replay = actions.add_parser(
        "replay-gold",
        help="replay each task's gold actions; print reward and final database hash",
        description="Replay each task's gold actions through our tools and reward; print reward and final DB hash per task.",
    )
    replay.add_argument(
        "--data",
        required=True,
        metavar="DIR",
        help="τ³-Retail data directory (db.json, tasks.json, split_tasks.json, policy.md)",
    )
    replay.add_argument("--split", default="base", help="task split: base (all 114), train or test (default: base)")
    replay.add_argument("--json", action="store_true", help="print one JSON object per task instead of a table")
    replay.set_defaults(handler=replay_gold_command)


def replay_gold_command(args: argparse.Namespace) -> int:
    import asyncio

    from aclarena_envs.retail.data import RetailData
    from aclarena_envs.retail.gold import gold_environment, play_gold

    try:
        data = RetailData.load(args.data)
        tasks = data.split(args.split)
    except ValueError as exc:  # DataDirError and DatabaseError are ValueErrors with a clear message
        raise CommandError(str(exc)) from exc

    async def replay_all() -> list[dict]:
        env = gold_environment(data)
        try:
            played = [await play_gold(env, task) for task in tasks]
        finally:
            await env.aclose()
        return [
            {"task_id": g.task_id, "reward": g.score.reward, "db_hash": g.db_hash, "errors": g.errors} for g in played
        ]

    rows = asyncio.run(replay_all())
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        _print_table(rows, data.db.hash, args.split)
    return 0 if all(r["reward"] == 1.0 for r in rows) else 1


def _print_table(rows: list[dict], untouched_hash: str, split: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"τ³-Retail gold replay — split {split}")
    table.add_column("task", justify="right")
    table.add_column("reward", justify="right")
    table.add_column("final db hash")
    table.add_column("refused gold actions")
    for r in rows:
        table.add_row(r["task_id"], f"{r['reward']:.1f}", r["db_hash"], "; ".join(r["errors"]))
    console = Console()
    console.print(table)
    perfect = sum(r["reward"] == 1.0 for r in rows)
    console.print(f"reward 1.0 on {perfect}/{len(rows)} tasks; untouched database hash {untouched_hash}")
