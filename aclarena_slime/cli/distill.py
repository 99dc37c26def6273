"""``aclarena distill sdft-data``: oracle rollout dumps → one domain-tagged chat-SFT mixture for the SDFT backbone."""

from __future__ import annotations

import argparse
import json
from typing import Any

from aclarena_slime.cli import CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("distill", help="distillation data (SDFT mixture)", description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sdft = actions.add_parser(
        "sdft-data",
        help="filter oracle rollouts by reward and write the SDFT mixture (slime SFT JSONL)",
        description=(
            "Keep each domain's finished oracle trajectories whose reward reaches its threshold, convert "
            "them to chat `messages` records (tool calls and results included), drop duplicates, and write "
            "one JSONL mixture tagged with metadata.domain. Dumps are slime --save-debug-rollout-data .pt "
            "files, JSONL with `messages` (e.g. eval samples), or folders of them."
        ),
    )
    sdft.add_argument(
        "--dumps",
        nargs="+",
        required=True,
        metavar="[DOMAIN=]PATH",
        help="dump files or folders; DOMAIN= overrides the domain the records name (metadata.env)",
    )
    sdft.add_argument(
        "--threshold",
        action="append",
        required=True,
        metavar="[DOMAIN=]REWARD",
        help="keep rewards >= REWARD; a bare value is the default for every domain (repeatable)",
    )
    sdft.add_argument("--out", required=True, help="the mixture JSONL to write")
    sdft.add_argument("--max-per-prompt", type=int, default=None, help="at most this many trajectories per prompt")
    sdft.add_argument(
        "--status",
        nargs="+",
        default=["completed"],
        metavar="STATUS",
        help="episode statuses to keep (default: completed; a warm start may keep truncated ones too)",
    )
    sdft.add_argument("--max-tokens", type=int, default=None, help="drop episodes longer than this (prompt + response)")
    sdft.add_argument("--force", action="store_true", help="replace --out if it exists")
    sdft.add_argument("--trust-pickle", action="store_true", help="read .pt dumps holding arbitrary objects")
    sdft.add_argument("--json", action="store_true", help="print the report as JSON")
    sdft.set_defaults(handler=run_sdft_data)


def run_sdft_data(args: argparse.Namespace) -> int:
    from aclarena_slime.distill.dumps import DumpError, dump_files, read_dump
    from aclarena_slime.distill.sdft import MixtureError, build_mixture, write_mixture

    if args.max_per_prompt is not None and args.max_per_prompt < 1:
        raise CommandError("--max-per-prompt must be at least 1")
    try:
        settings = _settings(args.threshold, args.max_per_prompt, tuple(args.status), args.max_tokens)
        sources = [(domain, path) for domain, raw in map(_split, args.dumps) for path in dump_files([raw])]
        episodes = (ep for domain, path in sources for ep in read_dump(path, domain, trust_pickle=args.trust_pickle))
        records, report = build_mixture(episodes, settings)
        if not records:
            raise CommandError(f"no trajectory passed the filter; nothing written ({json.dumps(report.to_dict())})")
        out = write_mixture(records, args.out, overwrite=args.force)
    except (DumpError, MixtureError) as exc:
        raise CommandError(str(exc)) from None
    summary = {"out": str(out), "records": len(records), "files": len(sources), "domains": report.to_dict()}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_table(summary)
    return 0


def _split(value: str) -> tuple[str | None, str]:
    """``DOMAIN=VALUE`` → (DOMAIN, VALUE); a bare value has no domain."""
    domain, sep, rest = value.partition("=")
    if sep and domain and "/" not in domain:
        return domain, rest
    return None, value


def _settings(
    thresholds: list[str], max_per_prompt: int | None, statuses: tuple[str, ...], max_tokens: int | None
) -> Any:
    from aclarena_slime.distill.sdft import MixtureSettings

    per_domain: dict[str, float] = {}
    default = None
    for raw in thresholds:
        domain, value = _split(raw)
        try:
            number = float(value)
        except ValueError:
            raise CommandError(f"--threshold {raw!r}: the reward must be a number") from None
        if domain is None:
            default = number
        else:
            per_domain[domain] = number
    return MixtureSettings(
        thresholds=per_domain,
        default_threshold=default,
        max_per_prompt=max_per_prompt,
        statuses=statuses,
        max_tokens=max_tokens,
    )


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"SDFT mixture → {summary['out']} ({summary['records']} records)")
    for column in ("domain", "read", "kept", "dropped"):
        table.add_column(column, justify="left" if column in ("domain", "dropped") else "right")
    for domain, counts in summary["domains"].items():
        dropped = ", ".join(f"{k} {v}" for k, v in counts["dropped"].items()) or "-"
        table.add_row(domain, str(counts["read"]), str(counts["kept"]), dropped)
    Console().print(table)
