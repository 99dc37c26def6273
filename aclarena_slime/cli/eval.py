"""``aclarena eval``: evaluate a model on a suite, emit slime's eval config, build the forgetting matrix."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

from aclarena_slime.cli import CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval", help="evaluation suites, forgetting matrix, paper tables", description=__doc__
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    run = actions.add_parser(
        "run",
        help="evaluate a model on a suite through any SGLang-speaking endpoint",
        description="Run every dataset of SUITE through its environment against ENDPOINT (SGLang, the router, "
        "or the local engine); with experts, each domain's requests carry its expert's lora_path. Writes "
        "OUT/samples/<dataset>.jsonl (one line per sample) and OUT/summary.json.",
    )
    run.add_argument("suite", type=Path, help="eval suite YAML (recipes/eval/*.yaml)")
    target = run.add_mutually_exclusive_group(required=True)
    target.add_argument("--endpoint", help="base URL, e.g. http://127.0.0.1:30000")
    target.add_argument("--local-model", type=Path, help="HF model folder: serve it here on the local engine (CPU)")
    run.add_argument("--tokenizer", help="the model's tokenizer folder (default: --local-model)")
    run.add_argument("--out", type=Path, required=True, help="results folder")
    run.add_argument("--data-root", type=Path, default=Path("."), help="folder that relative dataset paths start from")
    _service_argument(run)
    experts = run.add_mutually_exclusive_group()
    experts.add_argument("--experts", type=Path, help="experts.json: route each env tag to its LoRA expert")
    experts.add_argument("--expert", action="append", default=[], metavar="TAG=ADAPTER", help="one route (repeatable)")
    run.add_argument(
        "--load-experts",
        action="store_true",
        help="load the manifest's adapters into the endpoint first (always local)",
    )
    run.add_argument("--base-for-missing-expert", action="store_true", help="domains without an expert use the base")
    run.add_argument("--stage", help="curriculum stage this model is the output of (a row of the matrix)")
    run.add_argument("--only", nargs="+", metavar="DATASET", help="evaluate only these datasets")
    run.add_argument("--limit", type=int, help="first N records of every dataset (smoke runs)")
    run.add_argument("--concurrency", type=int, default=32, help="episodes in flight (default 32)")
    run.add_argument(
        "--resume", action="store_true", help="continue a stopped run in OUT, redoing only what is missing"
    )
    run.add_argument("--no-tokens", action="store_true", help="do not keep token ids per sample")
    run.add_argument("--json", action="store_true", help="print the summary as JSON")
    run.set_defaults(handler=run_command)

    config = actions.add_parser(
        "slime-config",
        help="write slime's --eval-config YAML for a suite",
        description="Write the --eval-config YAML that makes slime run SUITE's datasets during training "
        "through aclarena's generate/reward functions.",
    )
    config.add_argument("suite", type=Path)
    config.add_argument("-o", "--output", type=Path, required=True)
    config.add_argument(
        "--data-root", type=Path, default=Path("."), help="folder that relative dataset paths start from"
    )
    _service_argument(config)
    config.set_defaults(handler=slime_config_command)

    matrix = actions.add_parser(
        "matrix",
        help="forgetting matrix, BWT/FWT, paper-style tables and plots from eval summaries",
        description="Build the stage x domain accuracy matrix from a curriculum manifest or from eval summaries "
        "given in stage order; write matrix.json, forgetting.{md,csv,tex}, results.{md,csv,tex}, heatmap.png "
        "and curves.png to OUT.",
    )
    matrix.add_argument("summaries", nargs="*", type=Path, help="summary.json per stage, in training order")
    matrix.add_argument("--manifest", type=Path, help="curriculum manifest listing stages and their eval summaries")
    matrix.add_argument("--base", type=Path, help="summary of the initial model (enables FWT)")
    matrix.add_argument("--oracle", action="append", default=[], metavar="DOMAIN=SUMMARY", help="per-task oracle")
    matrix.add_argument("--mopd", type=Path, help="summary of the multi-teacher OPD model")
    matrix.add_argument("--mle", type=Path, help="summary of the mixture of LoRA experts")
    matrix.add_argument("--columns", default="domains", help="domains | datasets | comma list (table columns)")
    matrix.add_argument("--reference", default="paper", help="'paper', 'none', or a reference JSON file")
    matrix.add_argument(
        "--run",
        action="append",
        default=[],
        metavar="METHOD=PATH",
        help="compare runs instead: a curriculum manifest or one eval summary per method (repeat); writes "
        "comparison.{md,csv,tex,json,png} to OUT",
    )
    matrix.add_argument("--out", type=Path, required=True)
    matrix.add_argument("--json", action="store_true", help="print the matrix and metrics as JSON")
    matrix.set_defaults(handler=matrix_command)


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise CommandError(f"{flag} expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _service_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--service",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="value of a service the suite declares (retriever_url, retail_data_dir, user_sim_url, ...); repeatable",
    )


def run_command(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from aclarena_slime.evaluation import ResultsExist, RunSettings, SuiteError, load_experts, run_suite
    from aclarena_slime.evaluation.records import DatasetError
    from aclarena_slime.experts import ExpertError, ExpertTable
    from aclarena_slime.plugin.registry import PluginLoadError, UnknownEnvironment
    from aclarena_slime.recipes.compiler import load_stage_suite
    from aclarena_slime.sglang_client import SGLangClient, SGLangError, new_session

    try:
        services = _pairs(args.service, "--service")
        suite = load_stage_suite(args.suite, services).select(args.only).with_limit(args.limit).require_services()
        experts = None
        if args.experts:
            experts = ExpertTable.load(args.experts)
        elif args.expert:
            experts = ExpertTable.from_mapping(_pairs(args.expert, "--expert"))
    except (SuiteError, ExpertError) as exc:
        raise CommandError(str(exc)) from exc
    if not (args.tokenizer or args.local_model):
        raise CommandError("--tokenizer is required with --endpoint")
    tokenizer = _tokenizer(args.tokenizer or args.local_model)
    settings = RunSettings(
        out_dir=args.out,
        data_root=args.data_root,
        stage=args.stage,
        concurrency=args.concurrency,
        resume=args.resume,
        save_tokens=not args.no_tokens,
        base_for_missing_expert=args.base_for_missing_expert,
    )
    info = {
        "endpoint": args.endpoint or f"local:{args.local_model}",
        "tokenizer": str(args.tokenizer or args.local_model),
        "experts": str(args.experts or args.expert),
    }
    console = Console(stderr=True)

    async def evaluate(url: str) -> dict[str, Any]:
        async with new_session() as session:  # one pooled HTTP session for the whole suite
            client = SGLangClient(url, session=session)
            if (args.load_experts or args.local_model) and experts is not None:
                await load_experts(client, experts)
            with Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                console=console, disable=args.json or not console.is_terminal,
            ) as progress:  # fmt: skip
                return await run_suite(suite, client, tokenizer, settings, experts, progress, model_info=info)

    async def main() -> dict[str, Any]:
        if args.endpoint:
            return await evaluate(args.endpoint)
        from aclarena_slime.local.engine import open_engine

        async with open_engine(args.local_model).serve() as url:
            return await evaluate(url)

    try:
        summary = asyncio.run(main())
    except (SuiteError, DatasetError, ResultsExist, UnknownEnvironment, PluginLoadError) as exc:
        raise CommandError(str(exc)) from exc
    except SGLangError as exc:
        raise CommandError(f"{exc} (results so far are kept; rerun with --resume)") from exc
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)
    return 0


def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    except (OSError, ValueError) as exc:
        raise CommandError(f"cannot load a tokenizer from {path}: {exc}") from exc


def _print_summary(summary: dict[str, Any]) -> None:
    """A human-readable table on stdout."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"suite {summary['suite']}" + (f", stage {summary['stage']}" if summary.get("stage") else ""))
    for column in ("dataset", "domain", "expert", "accuracy %", "pass@n %", "prompts×n", "unscored"):
        table.add_column(column)
    for name, d in summary["datasets"].items():
        table.add_row(
            name, d["domain"], d["lora_path"] or "base", f"{d['accuracy']:.2f}", f"{d['pass_at_n']:.2f}",
            f"{d['n_prompts']}×{d['n_samples_per_prompt']}", str(d["n_unscored"]),
        )  # fmt: skip
    Console().print(table)


def slime_config_command(args: argparse.Namespace) -> int:
    from aclarena_slime.evaluation import SuiteError
    from aclarena_slime.recipes.compiler import load_stage_suite
    from aclarena_slime.recipes.eval_config import write_slime_eval_config

    try:
        suite = load_stage_suite(args.suite, _pairs(args.service, "--service")).require_services()
    except SuiteError as exc:
        raise CommandError(str(exc)) from exc
    print(write_slime_eval_config(suite, args.output, args.data_root.resolve()))
    return 0


def matrix_command(args: argparse.Namespace) -> int:
    from aclarena_slime.analysis.forgetting import MatrixError
    from aclarena_slime.analysis.report import table_columns, write_forgetting_report
    from aclarena_slime.analysis.sources import SourceError, from_manifest, from_summaries, load_summary
    from aclarena_slime.analysis.tables import PAPER_REFERENCE, load_reference

    if args.run:
        return _comparison(args)
    if bool(args.manifest) == bool(args.summaries):
        raise CommandError("give either --manifest or the stage summaries in order, not both or neither")
    try:
        curriculum = from_manifest(args.manifest) if args.manifest else from_summaries(args.summaries, args.base)
        if args.manifest and args.base:
            curriculum = type(curriculum)(curriculum.stages, load_summary(args.base, stage="base"), curriculum.missing)
        oracles = {d: load_summary(p, trained=d) for d, p in _pairs(args.oracle, "--oracle").items()}
        methods = [(key, label, load_summary(path)) for key, label, path in
                   (("mopd", "MOPD", args.mopd), ("mle", "MLE (ours)", args.mle)) if path]  # fmt: skip
        reference = None
        if args.reference != "none":
            reference = load_reference(PAPER_REFERENCE if args.reference == "paper" else args.reference)
        report = write_forgetting_report(
            curriculum, args.out, table_columns(curriculum, args.columns), oracles, methods, reference
        )
    except (SourceError, MatrixError, OSError, json.JSONDecodeError) as exc:
        raise CommandError(str(exc)) from exc
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print((args.out / "forgetting.md").read_text())
    print((args.out / "results.md").read_text())
    if curriculum.missing:
        print(f"stages without an eval summary yet: {', '.join(curriculum.missing)}", file=sys.stderr)
    return 0


def _comparison(args: argparse.Namespace) -> int:
    """``--run METHOD=PATH ...``: one table across methods (``--base`` gives every curriculum its FWT), and per
    curriculum its forgetting matrix, heatmap and curves in ``OUT/<method>/``."""
    from aclarena_slime.analysis.comparison import load_run, write_comparison
    from aclarena_slime.analysis.forgetting import MatrixError
    from aclarena_slime.analysis.report import table_columns, write_forgetting_report
    from aclarena_slime.analysis.sources import SourceError, from_manifest, load_summary

    if args.manifest or args.summaries:
        raise CommandError("--run compares whole runs; give the stage summaries or --manifest without it")
    try:
        runs = _pairs(args.run, "--run")
        rows = [load_run(method, path, args.base) for method, path in runs.items()]
        report = write_comparison(rows, args.out)
        for row in rows:
            if not row.stages:  # a single model's summary: no matrix
                continue
            curriculum = from_manifest(runs[row.method])
            if args.base:
                curriculum = type(curriculum)(curriculum.stages, load_summary(args.base, stage="base"),
                                              curriculum.missing, curriculum.monitor)  # fmt: skip
            folder = args.out / re.sub(r"[^A-Za-z0-9_.-]+", "_", row.method)
            write_forgetting_report(curriculum, folder, table_columns(curriculum, "domains"))
    except (SourceError, MatrixError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print((args.out / "comparison.md").read_text())
    for row in rows:
        if row.missing:
            print(f"{row.method}: stages without an eval summary yet: {', '.join(row.missing)}", file=sys.stderr)
    return 0
