"""The flags slime's ``train.py`` accepts, read from ``known_flags.txt`` (see ``regenerate_flags.py``).

Megatron parses slime's command line with unknown arguments ignored, so a misspelled flag would be
dropped without a word; every flag the compiler emits goes through :func:`check_flags` first.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable
from pathlib import Path

KNOWN_FLAGS_FILE = Path(__file__).with_name("known_flags.txt")

# SGLang 0.5.15.post1 keeps these server flags only as deprecated aliases (sglang/srt/server_args.py,
# ``action=DeprecatedAliasStoreAction`` / ``DeprecatedStore*Action`` with ``new_flag=``): the recipe
# must say the current one. Behind slime's ``--sglang-`` prefix.
DEPRECATED_SGLANG_FLAGS = {
    "--sglang-stream-output": "--sglang-incremental-streaming-output",
    "--sglang-nsa-prefill-backend": "--sglang-dsa-prefill-backend",
    "--sglang-nsa-decode-backend": "--sglang-dsa-decode-backend",
    "--sglang-mamba-scheduler-strategy": "--sglang-mamba-radix-cache-strategy",
    "--sglang-cuda-graph-max-bs": "--sglang-cuda-graph-max-bs-decode",
    "--sglang-cuda-graph-bs": "--sglang-cuda-graph-bs-decode",
    "--sglang-disable-cuda-graph": "--sglang-cuda-graph-backend-decode disabled --sglang-cuda-graph-backend-prefill disabled",
    "--sglang-enable-breakable-cuda-graph": "--sglang-cuda-graph-backend-prefill breakable",
    "--sglang-disable-piecewise-cuda-graph": "--sglang-cuda-graph-backend-prefill disabled",
    "--sglang-enforce-piecewise-cuda-graph": "--sglang-cuda-graph-backend-prefill tc_piecewise",
    "--sglang-piecewise-cuda-graph-tokens": "--sglang-cuda-graph-bs-prefill",
    "--sglang-piecewise-cuda-graph-compiler": "--sglang-cuda-graph-tc-compiler",
    "--sglang-piecewise-cuda-graph-max-tokens": "--sglang-cuda-graph-max-bs-prefill",
    "--sglang-enable-prefill-context-parallel": "--sglang-enable-prefill-cp",
    "--sglang-prefill-cp-mode": "--sglang-cp-strategy",
}


class UnknownFlagError(ValueError):
    """A flag neither slime nor Megatron-LM nor SGLang (``--sglang-*``) defines."""


@functools.lru_cache(maxsize=2)
def known_flags(path: Path = KNOWN_FLAGS_FILE) -> frozenset[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip() for line in lines if line.strip().startswith("--"))


def check_flags(flags: Iterable[tuple[str, str]]) -> None:
    """Raise on the first unknown flag; ``flags`` pairs each flag with where the recipe set it."""
    known = known_flags()
    for flag, origin in flags:
        if flag in DEPRECATED_SGLANG_FLAGS:
            raise UnknownFlagError(
                f"{origin}: {flag} is a deprecated SGLang alias; use {DEPRECATED_SGLANG_FLAGS[flag]}"
            )
        if flag not in known:
            near = difflib.get_close_matches(flag, known, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise UnknownFlagError(f"{origin}: {flag} is not a slime / Megatron-LM / SGLang flag{hint}")
