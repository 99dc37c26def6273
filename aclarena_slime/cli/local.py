"""``aclarena local run-stage RECIPE [overrides...]``: one stage recipe on the local backend (CPU, no slime).

``aclarena local serve-engine --model DIR``: the embedded engine alone, as an SGLang server (what
slime's external-engine mode calls), for ``launch/stage.sh RECIPE --smoke`` and for plugin authors.
"""

from __future__ import annotations

import argparse
import json
import sys

from aclarena_slime.cli import CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    from aclarena_slime.local.config import EngineSettings

    parser = subparsers.add_parser(
        "local",
        help="run an RL stage on the local backend (CPU, embedded engine)",
        description="The local backend: a whole stage on a CPU, for plugin authors, smoke tests and CI.",
    )
    sub = parser.add_subparsers(dest="local_command", required=True)
    stage = sub.add_parser(
        "run-stage",
        help="run a stage recipe on the local backend; writes RUNS/<stage>/local/adapter and metrics.json",
        description="Compose a stage recipe as launch/stage.sh does on the local backend (the cluster=local "
        "profile, paths.root = the working directory, unless the overrides say otherwise) and run it here.",
    )
    stage.add_argument("recipe", help="a stage recipe, e.g. recipes/stage1_math.yaml")
    stage.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides, e.g. rollout.num_rollout=4 algorithm.lr=5e-3 cluster.local.model=DIR",
    )
    stage.add_argument("--json", action="store_true", help="print the metrics as JSON")
    stage.set_defaults(handler=run_stage_command)
    serve = sub.add_parser(
        "serve-engine",
        help="serve a model (and LoRA adapters) on CPU with SGLang's HTTP API, for slime's external-engine mode",
        description="The embedded engine as an SGLang server: /generate, /server_info, /model_info, /health, "
        "/health_generate, /abort_request, /v1/loads, /flush_cache, LoRA load/unload, OpenAI chat. "
        "Each call is logged on stderr as '[engine] METHOD PATH STATUS'.",
    )
    serve.add_argument("--model", required=True, help="'tiny' (written into --work-dir) or a Hugging Face model dir")
    serve.add_argument(
        "--adapter", action="append", default=[], metavar="NAME=DIR", help="a PEFT adapter to load (repeatable)"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    serve.add_argument("--port", type=int, default=30000, help="port (SGLang's default 30000)")
    serve.add_argument("--served-name", default="local", help="OpenAI model name of the base model")
    serve.add_argument("--seed", type=int, default=0, help="sampling seed of requests without sampling_seed")
    serve.add_argument("--torch-threads", type=int, default=1, help="CPU threads for torch (1 suits tiny models)")
    serve.add_argument(
        "--max-running-requests",
        type=int,
        default=EngineSettings.max_running_requests,
        help="requests decoding together",
    )
    serve.add_argument(
        "--max-prefill-tokens", type=int, default=EngineSettings.max_prefill_tokens, help="prompt tokens per prefill"
    )
    serve.add_argument("--work-dir", default=".", help="where --model tiny is written (WORK_DIR/base_model)")
    serve.set_defaults(handler=serve_engine_command)


def run_stage_command(args: argparse.Namespace) -> int:
    from aclarena_slime.launcher.stage import local_profile, normalise_overrides
    from aclarena_slime.local.records import RecordError
    from aclarena_slime.local.run import run_local
    from aclarena_slime.local.stage import LocalStageError
    from aclarena_slime.plugin.registry import PluginLoadError, UnknownEnvironment
    from aclarena_slime.recipes.compose import RecipeError, load_recipe

    try:
        overrides = normalise_overrides(list(args.overrides))
        recipe = load_recipe(args.recipe, overrides, local_profile(overrides, always=True))
        out = run_local(recipe)
    except (RecipeError, LocalStageError, RecordError, UnknownEnvironment, PluginLoadError) as exc:
        raise CommandError(str(exc)) from exc
    metrics = out["metrics"]
    if args.json:
        json.dump(metrics, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    before, after = (metrics.get(k, {}).get("mean_reward") for k in ("eval_before", "eval_after"))
    print(f"{recipe.name} (env {recipe.data.env}) on the local backend: {len(metrics.get('steps', []))} steps")
    print(f"eval mean reward: {before} -> {after}")
    print(f"{'model' if out['full'] else 'adapter'}: {out['policy']}")
    print(f"metrics: {out['output_dir']}/metrics.json")
    return 0


def parse_adapters(items: list[str]) -> dict[str, str]:
    """``NAME=DIR`` pairs from ``--adapter``; a malformed or repeated name is an error."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise CommandError(f"--adapter {item!r}: expected NAME=DIR")
        if name in out:
            raise CommandError(f"--adapter {name!r} given twice")
        out[name] = path
    return out


def serve_engine_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from aclarena_slime.experts import ExpertError
    from aclarena_slime.local.config import EngineSettings, LocalConfigError
    from aclarena_slime.local.engine import open_engine
    from aclarena_slime.local.generation import GenerationError
    from aclarena_slime.local.sglang_server import serve
    from aclarena_slime.local.stage import LocalStageError, prepare_model

    adapters = parse_adapters(args.adapter)
    if not 0 < args.port < 65536:
        raise CommandError(f"--port must be 1..65535, got {args.port}")
    if args.torch_threads < 1:
        raise CommandError(f"--torch-threads must be positive, got {args.torch_threads}")
    torch.set_num_threads(args.torch_threads)
    try:
        model_dir = prepare_model(args.model, Path(args.work_dir), args.seed)
        settings = EngineSettings(args.max_running_requests, args.max_prefill_tokens)
        engine = open_engine(
            model_dir, seed=args.seed, settings=settings, served_name=args.served_name, adapters=adapters
        )
    except (LocalStageError, LocalConfigError, GenerationError, ExpertError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    serve(engine, model_dir, args.host, args.port)
    return 0
