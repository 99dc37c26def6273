"""Evaluation results kept by what determines them, so weights that have not changed are not rolled out again.

A dataset's results depend on the weights that answer it (the served model and the adapter its domain is routed
to, each by the bytes of its files, not its path), the dataset's settings and the engine's seed: the local
engine seeds every request by itself, so the same key gives the same samples. In the arena most of MLE's
evaluations ask a frozen backbone, or an expert that has not changed since its own stage, what the base row or
an earlier stage already asked; with a memo those datasets' samples are copied, and the runner's resume rolls
out only what is missing. A dataset is kept only when every sample of it was scored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aclarena_slime.evaluation.suite import EvalDataset


def folder_digest(path: str | Path) -> str:
    """sha256 of a file, or of every file under a folder (its relative name and its bytes, in name order)."""
    root = Path(path)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(root) if file != root else file.name).encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class EvalMemo:
    """A folder of ``<key>.jsonl`` sample files, one per evaluated dataset."""

    folder: Path

    @staticmethod
    def key(dataset: EvalDataset, weights: list[str], seed: int) -> str:
        """The key of ``dataset`` answered by ``weights`` (digests: the model's, then its adapter's if routed)."""
        text = json.dumps({"dataset": dataclasses.asdict(dataset), "weights": weights, "seed": seed},
                          sort_keys=True, default=str)  # fmt: skip
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def restore(self, key: str, samples: Path) -> bool:
        """Copy the kept samples of ``key`` to ``samples`` (when it does not exist yet); whether they were kept."""
        kept = self.folder / f"{key}.jsonl"
        if not kept.is_file():
            return False
        if not samples.exists():
            samples.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(kept, samples)
        return True

    def keep(self, key: str, samples: Path, result: dict[str, Any]) -> bool:
        """Keep ``samples`` under ``key`` when ``result`` (its dataset's summary) scored every sample."""
        if result.get("n_unscored", 1) != 0 or not samples.is_file():
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / f".{key}.{os.getpid()}.partial"
        shutil.copyfile(samples, partial)
        os.replace(partial, self.folder / f"{key}.jsonl")  # a reader never sees half a file
        return True
