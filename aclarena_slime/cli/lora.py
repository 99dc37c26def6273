"""``aclarena lora``: checks for the LoRA path of the Megatron actor."""

from __future__ import annotations

import argparse
import json

from . import CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    lora = subparsers.add_parser("lora", help="LoRA for Megatron: install checks", description=__doc__)
    commands = lora.add_subparsers(dest="lora_command", metavar="SUBCOMMAND", required=True)
    selftest = commands.add_parser(
        "selftest",
        help="check that a Megatron LoRA adapter exports to HF + PEFT with the same logits",
        description=(
            "Build a tiny Qwen3-shaped megatron-core model on CPU with random adapter weights, export the "
            "backbone (HF checkpoint) and the adapter (PEFT) into OUT, reload both with transformers + PEFT "
            "and print the largest logit difference. Exit status 1 when it exceeds the tolerance."
        ),
    )
    selftest.add_argument("--out", required=True, help="folder for the exported backbone/ and adapter/")
    selftest.add_argument("--tolerance", type=float, default=1e-4, help="largest allowed |logit difference| (fp32)")
    selftest.add_argument("--json", action="store_true", help="print the report as JSON")
    selftest.set_defaults(handler=_selftest)


def _selftest(args: argparse.Namespace) -> int:
    try:
        from aclarena_slime.lora.selftest import run_selftest
    except ImportError as exc:  # megatron-core is an extra
        raise CommandError(f"{exc}; install the 'megatron' extra (pip install 'aclarena-slime[megatron]')") from exc
    report = run_selftest(args.out, tolerance=args.tolerance)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        verdict = "OK" if report["ok"] else "FAILED"
        print(f"LoRA selftest {verdict}")
        print(
            f"  max |logit difference| Megatron vs HF+PEFT: {report['max_abs_logit_diff']:.3e} (tolerance {args.tolerance:g})"
        )
        print(f"  adapted model equals backbone at init:     {report['init_equals_backbone']}")
        print(f"  adapter: {report['adapter_tensors']} tensors, {report['adapter_params']} parameters")
        print(f"  backbone: {report['backbone_dir']}\n  adapter:  {report['adapter_dir']}")
    return 0 if report["ok"] else 1
