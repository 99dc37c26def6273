"""``aclarena data prepare ENV ARGS...``: each environment's own data preparation, by tag."""

from __future__ import annotations

import argparse
import inspect

from aclarena_slime.cli import CommandError
from aclarena_slime.dotted import load_dotted


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="prepare datasets as slime JSONL", description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    prepare = actions.add_parser(
        "prepare",
        help="convert an env's source data into slime JSONL",
        description="Run ENV's data preparation; `aclarena data prepare ENV --help` lists its options.",
        add_help=False,
    )
    prepare.add_argument("env", metavar="ENV")
    prepare.add_argument("rest", nargs=argparse.REMAINDER)
    prepare.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from aclarena_slime.plugin.registry import PluginLoadError, UnknownEnvironment, is_variant, load_factory

    try:
        factory = load_factory(args.env)
        variant = is_variant(args.env)
    except (UnknownEnvironment, PluginLoadError) as exc:
        raise CommandError(str(exc)) from exc
    target = getattr(factory, "prepare_data", None)
    if not target:
        raise CommandError(f"environment {args.env!r} has no data preparation")
    prepare = load_dotted(target)
    # A variant tag's records carry the variant: its plugin's preparation takes the tag (``main(argv, tag=...)``).
    if variant and "tag" not in inspect.signature(prepare).parameters:
        raise CommandError(
            f"{args.env!r} is a variant tag, but {target} writes its plugin's tag into the records (it takes no tag=)"
        )
    try:
        return int((prepare(list(args.rest), tag=args.env) if variant else prepare(list(args.rest))) or 0)
    except (ValueError, OSError) as exc:  # bad or missing input data: the user's to fix, not a traceback
        raise CommandError(f"{args.env}: {exc}") from exc
