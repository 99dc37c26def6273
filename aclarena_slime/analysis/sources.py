"""Where the forgetting matrix gets its numbers: eval summaries, listed by a curriculum manifest or by hand.

An eval summary is the ``summary.json`` that ``aclarena eval run`` writes; the matrix needs only::

    {"stage": "stage1_math", "domains": {"math": 25.83, "search": 31.0}, "trained": "math"}

(``trained`` optional; ``datasets`` with per-dataset ``accuracy`` and ``domain`` feeds the tables).

The curriculum manifest lists the stages in training order; the reader takes this layout (paths
relative to the manifest's folder)::

    {"stages": [{"name": "stage1_math", "env": "math", "eval": "stage1_math/eval/summary.json"}, ...],
     "base": {"eval": "base/eval/summary.json"}}

The trained domain of a stage is ``env`` (or ``domain`` / ``trained``) in the manifest, else
``trained`` in the summary, else the one known domain whose name appears in the stage name.
Stages whose eval has not been written yet are left out and listed in ``missing``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aclarena_slime.analysis.forgetting import ForgettingMatrix


class SourceError(ValueError):
    pass


@dataclass(frozen=True)
class StageResult:
    stage: str
    trained: str | None
    domains: dict[str, float]
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def column(self, key: str) -> float | None:
        """A domain's accuracy, or a dataset's when ``key`` names a dataset."""
        if key in self.domains:
            return self.domains[key]
        entry = self.datasets.get(key)
        return float(entry["accuracy"]) if entry and entry.get("accuracy") is not None else None

    def domain_of(self, key: str) -> str:
        entry = self.datasets.get(key)
        return str(entry.get("domain", key)) if entry else key


@dataclass(frozen=True)
class Curriculum:
    stages: list[StageResult]
    base: StageResult | None = None
    missing: list[str] = field(default_factory=list)
    # (stage, the forgetting monitor's report) for the stages it watched, in training order
    monitor: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def matrix(self, domains: Sequence[str] | None = None) -> ForgettingMatrix:
        if not self.stages:
            raise SourceError("no stage has an eval summary yet")
        return ForgettingMatrix.from_rows(
            [(s.stage, s.trained, s.domains) for s in self.stages],
            base=self.base.domains if self.base else None,
            domains=domains,
        )


def load_summary(path: str | Path, stage: str | None = None, trained: str | None = None) -> StageResult:
    """Read one eval summary; ``stage`` / ``trained`` override what the file says."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SourceError(f"cannot read eval summary {path}: {exc}") from exc
    return parse_summary(data, str(path), stage, trained)


def parse_summary(data: Any, source: str, stage: str | None = None, trained: str | None = None) -> StageResult:
    if not isinstance(data, Mapping) or not isinstance(data.get("domains"), Mapping):
        raise SourceError(f"{source}: an eval summary is an object with 'domains': {{domain: accuracy}}")
    domains = {}
    for domain, value in data["domains"].items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SourceError(f"{source}: accuracy of domain {domain!r} is not a number: {value!r}")
        domains[str(domain)] = float(value)
    name = stage or data.get("stage") or Path(source).parent.name or source
    datasets = data.get("datasets") if isinstance(data.get("datasets"), Mapping) else {}
    return StageResult(str(name), trained or data.get("trained"), domains, dict(datasets))


def infer_trained(stage: str, domains: Sequence[str]) -> str | None:
    """The single known domain whose name is a word of the stage name (``stage1_math`` -> ``math``)."""
    words = set(re.split(r"[^A-Za-z0-9]+", stage.lower()))
    hits = [d for d in domains if d.lower() in words]
    return hits[0] if len(hits) == 1 else None


def from_summaries(paths: Sequence[str | Path], base: str | Path | None = None) -> Curriculum:
    """Stages in the order given (no manifest)."""
    stages = [load_summary(p) for p in paths]
    return _with_inferred(Curriculum(stages, load_summary(base, stage="base") if base else None))


def from_manifest(path: str | Path) -> Curriculum:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SourceError(f"cannot read curriculum manifest {path}: {exc}") from exc
    entries = data.get("stages") if isinstance(data, Mapping) else None
    if not isinstance(entries, list):
        raise SourceError(f"{path}: a curriculum manifest has a 'stages' list in training order")
    root, stages, missing, monitor = path.parent, [], [], []
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, Mapping) or not entry.get("name"):
            raise SourceError(f"{path}: stage {number} needs a 'name'")
        if isinstance(entry.get("monitor"), Mapping) and entry["monitor"].get("curves"):
            monitor.append((str(entry["name"]), dict(entry["monitor"])))
        summary = _eval_path(entry, root)
        if summary is None or not summary.exists():
            missing.append(str(entry["name"]))
            continue
        trained = entry.get("env") or entry.get("domain") or entry.get("trained")
        stages.append(load_summary(summary, stage=str(entry["name"]), trained=trained))
    base_entry = data.get("base")
    base_path = _eval_path(base_entry, root) if isinstance(base_entry, Mapping) else None
    if base_path is None and data.get("base_eval"):
        base_path = root / data["base_eval"]
    base = load_summary(base_path, stage="base") if base_path is not None and base_path.exists() else None
    return _with_inferred(Curriculum(stages, base, missing, monitor))


def _eval_path(entry: Mapping[str, Any], root: Path) -> Path | None:
    value = entry.get("eval") or entry.get("eval_summary")
    if isinstance(value, Mapping):
        value = value.get("summary")
    return root / value if value else None


def _with_inferred(curriculum: Curriculum) -> Curriculum:
    known = sorted({d for s in curriculum.stages for d in s.domains})
    stages = [
        s if s.trained else StageResult(s.stage, infer_trained(s.stage, known), s.domains, s.datasets)
        for s in curriculum.stages
    ]
    return Curriculum(stages, curriculum.base, curriculum.missing, curriculum.monitor)
