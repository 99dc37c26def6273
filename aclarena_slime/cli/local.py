"""``aclarena local run-stage --env TAG ...``: one RL stage on the local backend (CPU, no slime)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from typing import Any

from aclarena_slime.cli import CommandError
from aclarena_slime.local.config import LocalConfigError, LocalStageConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "local",
        help="run an RL stage on the local backend (CPU, embedded engine)",
        description="The local backend: a whole stage on a CPU, for plugin authors, smoke tests and CI.",
    )
    sub = parser.add_subparsers(dest="local_command", required=True)
    stage = sub.add_parser(
        "run-stage",
        help="roll out, train a LoRA expert, evaluate; writes OUTPUT/adapter and OUTPUT/metrics.json",
        description="Run one stage on the local backend with the settings of LocalStageConfig.",
    )
    stage.add_argument("--env", required=True, help="environment tag (math, search, retail, ifeval, learnable, ...)")
    stage.add_argument("--output-dir", required=True, help="folder for the adapter and metrics.json")
    stage.add_argument("--model", default="tiny", help="'tiny' (built in-process) or a Hugging Face model directory")
    stage.add_argument("--steps", type=int, default=None, help="training steps")
    stage.add_argument("--env-config", default="{}", help="env config as a JSON object")
    stage.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other LocalStageConfig setting; VALUE is JSON when it parses, else a string (repeatable)",
    )
    stage.add_argument("--json", action="store_true", help="print the metrics as JSON")
    stage.set_defaults(handler=run_stage_command)


def config_from_args(args: argparse.Namespace) -> LocalStageConfig:
    values: dict[str, Any] = {"env": args.env, "output_dir": args.output_dir, "model": args.model}
    if args.steps is not None:
        values["steps"] = args.steps
    try:
        values["env_config"] = json.loads(args.env_config)
    except json.JSONDecodeError as exc:
        raise CommandError(f"--env-config is not valid JSON: {exc}") from exc
    known = {f.name for f in fields(LocalStageConfig)}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep or key not in known:
            raise CommandError(f"--set {item!r}: expected KEY=VALUE with KEY one of {sorted(known)}")
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
    try:
        return LocalStageConfig.from_mapping(values)
    except (LocalConfigError, TypeError) as exc:
        raise CommandError(str(exc)) from exc


def run_stage_command(args: argparse.Namespace) -> int:
    from aclarena_slime.local.records import RecordError
    from aclarena_slime.local.stage import LocalStageError, run_stage
    from aclarena_slime.registry import PluginLoadError, UnknownEnvironment

    cfg = config_from_args(args)
    try:
        metrics = run_stage(cfg)
    except (LocalStageError, RecordError, UnknownEnvironment, PluginLoadError) as exc:
        raise CommandError(str(exc)) from exc
    if args.json:
        json.dump(metrics, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    before, after = metrics["eval_before"]["mean_reward"], metrics["eval_after"]["mean_reward"]
    print(f"env {metrics['env']}: {len(metrics['steps'])} steps in {metrics['seconds']} s")
    print(f"eval mean reward: {before} -> {after}")
    print(f"adapter: {metrics['adapter_dir']}")
    print(f"metrics: {cfg.metrics_path}")
    return 0
