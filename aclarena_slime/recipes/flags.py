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
        if flag not in known:
            near = difflib.get_close_matches(flag, known, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise UnknownFlagError(f"{origin}: {flag} is not a slime / Megatron-LM / SGLang flag{hint}")
