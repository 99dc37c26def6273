"""``aclarena analyze entropy``: how stable checkpoint k's token choices are under checkpoint k+1."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from aclarena_slime.cli import CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("analyze", help="analyses of trained checkpoints", description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    entropy = actions.add_parser(
        "entropy",
        help="token-entropy stability across consecutive checkpoints",
        description="For the same prompts and responses, classify each model-written token by its entropy under "
        "checkpoint k and check whether checkpoint k+1 keeps its top choice. Distributions come from local "
        "models (--checkpoint, in stage order, with --samples) or from saved SGLang top-k log-probs "
        "(--top-k, one file per checkpoint). Writes entropy.{json,md,csv,png} to OUT.",
    )
    source = entropy.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", action="append", type=Path, help="HF model or PEFT adapter folder (repeat)")
    source.add_argument("--top-k", action="append", type=Path, help="saved top-k JSONL per checkpoint (repeat)")
    entropy.add_argument("--samples", type=Path, help="JSONL of sequences (an eval run's samples/<dataset>.jsonl)")
    entropy.add_argument("--label", action="append", help="name per checkpoint (default: folder or file name)")
    entropy.add_argument("--limit", type=int, help="first N sequences only")
    threshold = entropy.add_mutually_exclusive_group()
    threshold.add_argument("--threshold", type=float, help="entropy threshold in nats (high: above it)")
    threshold.add_argument("--high-quantile", type=float, default=0.2, help="share of tokens called high-entropy")
    entropy.add_argument("--bins", type=int, default=10, help="entropy bins in the plot (equal counts)")
    entropy.add_argument("--out", type=Path, required=True)
    entropy.add_argument("--json", action="store_true", help="print the report as JSON")
    entropy.set_defaults(handler=entropy_command)


def entropy_command(args: argparse.Namespace) -> int:
    from aclarena_slime.analysis.entropy import EntropyError, compare_chain
    from aclarena_slime.analysis.entropy_sources import top_logprob_stats
    from aclarena_slime.analysis.report import entropy_markdown, write_entropy_report

    sources = args.checkpoint or args.top_k
    labels = args.label or [p.stem if p.is_file() else p.name for p in sources]
    if len(labels) != len(sources):
        raise CommandError(f"{len(labels)} --label for {len(sources)} checkpoints")
    try:
        if args.checkpoint:
            if args.samples is None:
                raise CommandError("--checkpoint needs --samples (the sequences to score)")
            stats = _model_stats(args.checkpoint, args.samples, args.limit)
        else:
            stats = top_logprob_stats(args.top_k)
        reports = compare_chain(
            stats, labels, threshold=args.threshold, high_quantile=args.high_quantile, n_bins=args.bins
        )
        result = write_entropy_report(reports, args.out)
    except (EntropyError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    print(json.dumps(result, indent=2) if args.json else entropy_markdown(reports))
    return 0


def _model_stats(checkpoints: list[Path], samples: Path, limit: int | None) -> list[Any]:
    """One model in memory at a time: score every sequence, free it, load the next."""
    from aclarena_slime.analysis.entropy_sources import load_causal_lm, model_stats, read_sequences

    sequences = read_sequences(samples, _tokenizer_or_none(checkpoints[0]), limit)
    stats = []
    for path in checkpoints:
        try:
            model = load_causal_lm(path)
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot load a model from {path}: {exc}") from exc
        stats.append(model_stats(model, sequences))
        del model
    return stats


def _tokenizer_or_none(path: Path) -> Any:
    """The first checkpoint's tokenizer, for text records; token-id records need none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return None
