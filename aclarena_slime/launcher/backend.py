"""Which backend runs a stage: slime when slime and a GPU are present, else the local one; always with a reason."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

LOCAL_KINDS = ("rl", "sft")  # the stage kinds the local backend runs (aclarena_slime.local.spec)


@dataclass(frozen=True)
class BackendChoice:
    name: str  # "slime" or "local"
    reason: str


def slime_available() -> bool:
    # PyPI's "slime" is an unrelated package; THUDM/slime has slime.rollout.
    try:
        return importlib.util.find_spec("slime") is not None and importlib.util.find_spec("slime.rollout") is not None
    except (ImportError, ValueError):
        return False


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def choose_backend(requested: str, has_slime: bool | None = None, gpus: int | None = None) -> BackendChoice:
    """``requested`` is auto | slime | local; what is missing for slime is said, never guessed around."""
    has_slime = slime_available() if has_slime is None else has_slime
    gpus = gpu_count() if gpus is None else gpus
    missing = [what for what, ok in (("slime (THUDM/slime importable)", has_slime), ("a CUDA GPU", gpus > 0)) if not ok]
    if requested == "local":  # the local profile sets it too: say what this machine has, not only what was asked
        if missing:
            return BackendChoice("local", _not_here(has_slime, gpus))
        return BackendChoice("local", f"backend=local requested (slime importable, {gpus} GPU(s) here)")
    if requested == "slime":
        if missing:
            raise BackendUnavailable(f"backend=slime requested but this machine lacks {' and '.join(missing)}")
        return BackendChoice("slime", f"backend=slime requested; slime importable, {gpus} GPU(s)")
    if not missing:
        return BackendChoice("slime", f"slime importable and {gpus} GPU(s) found")
    return BackendChoice("local", _not_here(has_slime, gpus))


def _not_here(has_slime: bool, gpus: int) -> str:
    """What this machine lacks for slime, as seen: e.g. ``no CUDA GPU here``."""
    lacks = [what for what, ok in (("slime not importable", has_slime), ("no CUDA GPU", gpus > 0)) if not ok]
    return f"{', '.join(lacks)} here"


class BackendUnavailable(RuntimeError):
    pass


def runs_local(recipe: Any) -> bool:
    """Whether the local backend runs ``recipe`` here: the one predicate the launcher and the curriculum share.

    A kind the local backend cannot run at all (e.g. SDFT) goes to slime; ``backend=slime`` on a machine
    without it is not local either (running it reports what is missing).
    """
    if recipe.kind not in LOCAL_KINDS:
        return False
    try:
        return choose_backend(recipe.cluster.backend).name == "local"
    except BackendUnavailable:
        return False
