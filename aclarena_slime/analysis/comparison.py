"""One table across methods: several runs (curricula or single models) side by side.

A run is a curriculum manifest (sequential, replay, KL anchor, MLE: the forgetting matrix gives average
accuracy, BWT, FWT and maximum forgetting; its stages' recorded ``cost`` gives rollout tokens and trainer
steps) or one eval summary (MOPD, an oracle: only its average accuracy over domains). A manifest of
independent stages (two or more, each started from the base, no experts: the oracles) is no chain: its
row is each domain's accuracy after the stage that trained it alone. Every row also keeps the final
accuracy per domain (``domains``: a chain's last row), so a method is compared with the oracles domain by
domain. Written as Markdown, CSV, LaTeX and a bar plot by ``aclarena eval matrix --run METHOD=PATH ...``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from aclarena_slime.analysis.sources import SourceError, from_manifest, load_summary
from aclarena_slime.analysis.tables import _tex

COLUMNS = (
    ("average_accuracy", "Avg acc"),
    ("bwt", "BWT"),
    ("fwt", "FWT"),
    ("max_forgetting", "Max forgetting"),
    ("rollout_tokens", "Rollout tokens"),
    ("trainer_steps", "Trainer steps"),
)


@dataclass(frozen=True)
class MethodRow:
    method: str
    values: dict[str, float | int | None]
    stages: int  # 0 for a single model
    missing: list[str]  # stages without an eval summary yet
    domains: dict[str, float | None] = field(default_factory=dict)  # final accuracy per domain
    independent: bool = False  # the oracles: each domain's own stage, not a chain


def load_run(method: str, path: str | Path, base: str | Path | None = None) -> MethodRow:
    """A run's row: from a curriculum manifest (``stages`` list) or a single eval summary."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SourceError(f"{method}: cannot read {path}: {exc}") from exc
    if not (isinstance(data, Mapping) and isinstance(data.get("stages"), list)):
        result = load_summary(path, stage=method)
        values = [v for v in result.domains.values() if v is not None]
        return MethodRow(method, {"average_accuracy": mean(values) if values else None}, 0, [], dict(result.domains))
    curriculum = from_manifest(path)
    if base is not None:
        curriculum = type(curriculum)(curriculum.stages, load_summary(base, stage="base"), curriculum.missing)
    costs = [s.get("cost") or {} for s in data["stages"] if isinstance(s, Mapping)]
    cost = {
        "rollout_tokens": _total(c.get("rollout_tokens") for c in costs),
        "trainer_steps": _total(c.get("trainer_steps") for c in costs),
    }
    if is_independent(data):
        own = {s.trained: s.domains.get(s.trained) for s in curriculum.stages if s.trained}
        known = [v for v in own.values() if v is not None]
        row = {"average_accuracy": mean(known) if known else None, **cost}
        return MethodRow(method, row, len(curriculum.stages), list(curriculum.missing), own, independent=True)
    matrix = curriculum.matrix()
    metrics = matrix.metrics()
    drops = [v for v in metrics["max_forgetting"].values() if v is not None]
    values: dict[str, float | int | None] = {
        "average_accuracy": metrics["average_accuracy"],
        "bwt": metrics["bwt"],
        "fwt": metrics["fwt"],
        "max_forgetting": max(drops) if drops else None,
        **cost,
    }
    final = dict(zip(matrix.domains, matrix.values[-1], strict=True))
    return MethodRow(method, values, len(curriculum.stages), list(curriculum.missing), final)


def is_independent(manifest: Mapping[str, Any]) -> bool:
    """Whether a manifest's stages are separate models: two or more, each from the base, no experts (oracles)."""
    stages = [s for s in manifest.get("stages") or [] if isinstance(s, Mapping)]
    return len(stages) > 1 and not manifest.get("experts") and all(not s.get("start_from") for s in stages)


def domains_markdown(rows: Sequence[MethodRow]) -> str:
    """Final accuracy per domain and method (the oracles: each domain's own stage)."""
    domains = sorted({d for r in rows for d in r.domains})
    lines = ["| Method | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    for row in rows:
        lines.append(f"| {row.method} | " + " | ".join(_cell("", row.domains.get(d)) for d in domains) + " |")
    return "\n".join(lines) + "\n"


def _total(values: Any) -> int | None:
    """The sum, or None when any stage's figure is unknown (a partial sum would understate the cost)."""
    values = list(values)
    return None if not values or any(v is None for v in values) else int(sum(values))


def _cell(key: str, value: float | int | None) -> str:
    if value is None:
        return "–"
    if key in ("rollout_tokens", "trainer_steps"):
        return f"{int(value):,}"
    return f"{value:.2f}"


def to_markdown(rows: Sequence[MethodRow]) -> str:
    lines = ["| Method | " + " | ".join(t for _, t in COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append(f"| {row.method} | " + " | ".join(_cell(k, row.values.get(k)) for k, _ in COLUMNS) + " |")
    lines += [
        "",
        "Avg acc: mean accuracy (%) over domains after the last stage. BWT / FWT: backward / forward transfer "
        "(points). Max forgetting: the largest drop of a domain below its just-trained accuracy. Costs: summed "
        "over stages (– when a stage's figure is unknown, e.g. rollout tokens on slime).",
    ]
    return "\n".join(lines) + "\n"


def to_csv(rows: Sequence[MethodRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["method", *(k for k, _ in COLUMNS), "stages", "missing_stages"])
    for row in rows:
        cells = ["" if row.values.get(k) is None else repr(row.values[k]) for k, _ in COLUMNS]
        writer.writerow([row.method, *cells, row.stages, ";".join(row.missing)])
    return out.getvalue()


def to_latex(rows: Sequence[MethodRow], caption: str = "Comparison of continual-learning methods.") -> str:
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\begin{tabular}{l" + "r" * len(COLUMNS) + "}",
        r"\toprule",
        "Method & " + " & ".join(_tex(t) for _, t in COLUMNS) + r" \\",
        r"\midrule",
    ]
    for row in rows:
        cells = [_cell(k, row.values.get(k)).replace(",", "{,}").replace("–", "--") for k, _ in COLUMNS]
        lines.append(_tex(row.method) + " & " + " & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{_tex(caption)}}}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_comparison(rows: Sequence[MethodRow], out_dir: str | Path) -> dict[str, Any]:
    """``comparison.{md,csv,tex,json}`` and ``comparison.png`` in ``out_dir``."""
    from aclarena_slime.analysis import plots

    if not rows:
        raise SourceError("no runs to compare")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = [{"method": r.method, **r.values, "stages": r.stages, "missing_stages": r.missing,
              "domains": r.domains, "independent": r.independent} for r in rows]  # fmt: skip
    files = {
        "comparison.md": to_markdown(rows) + "\nFinal accuracy per domain:\n\n" + domains_markdown(rows),
        "comparison.csv": to_csv(rows),
        "comparison.tex": to_latex(rows),
        "comparison.json": json.dumps({"methods": table}, indent=2) + "\n",
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    figure = plots.method_bars([(r.method, r.values) for r in rows], out / "comparison.png")
    return {"methods": table, "files": sorted([str(out / n) for n in files] + [str(figure)])}
