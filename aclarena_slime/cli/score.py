"""``aclarena score ENV``: score one model response read from stdin, for plugin authors."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from aclarena_slime.cli import CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "score",
        help="score a model response (stdin) with an environment",
        description="Read a model response on stdin, run it through ENV as the model's turn, print the score as JSON.",
    )
    parser.add_argument("env", metavar="ENV", help="an installed environment tag (entry-point group aclarena_slime.envs)")
    parser.add_argument("--label", required=True, help="the record's label, as JSON (e.g. '\"73\"')")
    parser.add_argument("--metadata", default="{}", help="the record's metadata, as a JSON object")
    parser.add_argument("--prompt", default="", help="the record's prompt (some envs need it)")
    parser.add_argument("--config", default="{}", help="env config as a JSON object (as a recipe would give)")
    parser.add_argument("--json", action="store_true", help="JSON output (the default; kept for symmetry)")
    parser.set_defaults(handler=run)


def _json_arg(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"--{name} is not valid JSON: {exc}") from exc


async def score_response(tag: str, response: str, label: Any, metadata: dict, prompt: str, config: dict) -> dict:
    from aclarena_slime.plugin.contract import Done, Task
    from aclarena_slime.plugin.registry import PluginLoadError, UnknownEnvironment, get_environment

    try:
        env = get_environment(tag, config)
    except (UnknownEnvironment, PluginLoadError) as exc:
        raise CommandError(str(exc)) from exc
    except ValueError as exc:  # a config the env refuses
        raise CommandError(f"{tag}: bad --config: {exc}") from exc
    try:
        episode = await env.start(Task(prompt=prompt, label=label, metadata={"env": tag, **metadata}))
        try:
            result = await episode.step(response)
            score = await episode.score()
        finally:
            await episode.close()
    except ValueError as exc:  # a label or metadata the env cannot use: the user's input, not a crash
        raise CommandError(f"{tag}: {exc}") from exc
    finally:
        await env.aclose()
    return {"env": tag, "reward": float(score.reward), "breakdown": score.breakdown, "ended": isinstance(result, Done)}


def run(args: argparse.Namespace) -> int:
    label = _json_arg("label", args.label)
    metadata = _json_arg("metadata", args.metadata)
    config = _json_arg("config", args.config)
    if not isinstance(metadata, dict) or not isinstance(config, dict):
        raise CommandError("--metadata and --config must be JSON objects")
    response = sys.stdin.read()
    out = asyncio.run(score_response(args.env, response, label, metadata, args.prompt, config))
    print(json.dumps(out, ensure_ascii=False))
    return 0
