"""Stage reuse between curricula: a finished stage is not computed again by another curriculum that would run
exactly the same thing.

Several curricula often begin alike: in the arena, the math oracle and the first stage of the sequential,
replay and KL-anchor chains all fine-tune the same base on math with the same settings and seed. A stage's
**fingerprint** is a hash of what determines its output: the resolved stage recipe (with the curriculum's own
output folder written as a placeholder, since every curriculum writes elsewhere), the evaluation it gets, and
the fingerprints of the stages whose outputs it reads (the stage it starts from, the experts served beside it,
the dumps it distills). Chained fingerprints make the start model's identity part of a stage's: two stages
from different weights never match, whatever their paths.

A curriculum with a ``reuse`` folder records each finished, evaluated stage there (``<fingerprint>.json``: its
manifest entry, paths made absolute); a stage whose fingerprint is already recorded takes that entry instead
of running (``reused_from`` in its manifest entry says whose it is). Only curricula whose evaluator is the same
should share a folder (the arena: one per seed).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import write_json_atomic

OUT = "<curriculum output_dir>"
PATH_KEYS = ("checkpoint", "hf_checkpoint", "adapter", "dumps")  # manifest entry keys holding output paths


def fingerprint(recipe: Any, output_dir: str | Path, inputs: Sequence[str | None], evaluation: Any) -> str | None:
    """The stage's fingerprint; None when an input stage has none (it ran without reuse: nothing to compare)."""
    if any(i is None for i in inputs):
        return None
    settings = _placeholders(dataclasses.asdict(recipe), [str(output_dir), str(Path(output_dir).resolve())])
    text = json.dumps({"recipe": settings, "inputs": list(inputs), "evaluation": evaluation}, sort_keys=True,
                      default=str)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _placeholders(value: Any, roots: list[str]) -> Any:
    """``value`` with every occurrence of the output folder in its strings replaced by :data:`OUT`."""
    if isinstance(value, str):
        for root in sorted(set(roots), key=len, reverse=True):
            value = value.replace(root, OUT)
        return value
    if isinstance(value, dict):
        return {k: _placeholders(v, roots) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_placeholders(v, roots) for v in value]
    return value


def find(folder: str | Path | None, key: str | None) -> dict[str, Any] | None:
    """The recorded entry of the finished stage with fingerprint ``key``, when its outputs still exist."""
    if not folder or not key:
        return None
    try:
        record = json.loads((Path(folder) / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    entry = record.get("entry") or {}
    paths = [entry.get(k) for k in PATH_KEYS] + [(entry.get("eval") or {}).get("summary")]
    if not all(Path(p).exists() for p in paths if p):
        return None
    return record


def record(folder: str | Path, key: str, curriculum: str, entry: dict[str, Any], output_dir: Path) -> None:
    """Record a finished stage's manifest ``entry`` under its fingerprint (paths relative to ``output_dir``
    made absolute)."""
    entry = json.loads(json.dumps(entry))
    for k in PATH_KEYS:
        if entry.get(k):
            entry[k] = str((output_dir / entry[k]).resolve())
    if (entry.get("eval") or {}).get("summary"):
        entry["eval"]["summary"] = str((output_dir / entry["eval"]["summary"]).resolve())
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(folder) / f"{key}.json", {"curriculum": curriculum, "stage": entry["name"],
                                                     "entry": entry})  # fmt: skip
