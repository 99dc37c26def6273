"""Writing an analysis to a folder: JSON for machines, Markdown/CSV/LaTeX tables and PNGs for people."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aclarena_slime.analysis import plots
from aclarena_slime.analysis.entropy import PairReport
from aclarena_slime.analysis.sources import Curriculum, StageResult
from aclarena_slime.analysis.tables import (
    Reference,
    matrix_table,
    metrics_markdown,
    paper_table,
    to_csv,
    to_latex,
    to_markdown,
)


def table_columns(curriculum: Curriculum, choice: str) -> list[str]:
    """``domains`` (the matrix's columns), ``datasets`` (every dataset of the summaries), or a comma list."""
    if choice == "domains":
        return list(curriculum.matrix().domains)
    if choice == "datasets":
        results = [*curriculum.stages, *([curriculum.base] if curriculum.base else [])]
        return list(dict.fromkeys(name for r in results for name in r.datasets))
    return [c.strip() for c in choice.split(",") if c.strip()]


def write_forgetting_report(
    curriculum: Curriculum,
    out_dir: str | Path,
    columns: Sequence[str],
    oracles: Mapping[str, StageResult] | None = None,
    methods: Sequence[tuple[str, str, StageResult]] = (),
    reference: Reference | None = None,
) -> dict[str, Any]:
    """The matrix with its metrics, the paper-style results table, a heatmap and per-domain curves."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    matrix = curriculum.matrix()
    titles = reference.titles if reference else {}
    forgetting = matrix_table(matrix, titles)
    results = paper_table(curriculum, columns, oracles, methods, reference)
    metrics = matrix.metrics()
    files = {
        "matrix.json": json.dumps({**matrix.to_dict(), "missing_stages": curriculum.missing}, indent=2) + "\n",
        "forgetting.md": to_markdown(forgetting) + "\n" + metrics_markdown(metrics),
        "forgetting.csv": to_csv(forgetting),
        "forgetting.tex": to_latex(forgetting, caption="Accuracy (%) on every domain after every stage."),
        "results.md": to_markdown(results),
        "results.csv": to_csv(results),
        "results.tex": to_latex(results, caption="Accuracy (%) per domain."),
    }
    if curriculum.monitor:
        files["monitor.json"] = json.dumps(dict(curriculum.monitor), indent=2) + "\n"
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    figures = [
        plots.heatmap(matrix, out / "heatmap.png", titles),
        plots.domain_curves(matrix, out / "curves.png", titles),
    ]
    if curriculum.monitor:  # the forgetting monitor watched some stages while they trained
        figures.append(plots.monitor_curves(curriculum.monitor, out / "monitor.png", titles))
    return {
        "matrix": matrix.to_dict(),
        "missing_stages": curriculum.missing,
        "files": sorted([str(out / n) for n in files] + [str(f) for f in figures]),
    }


def entropy_table(reports: Sequence[PairReport]) -> list[dict[str, Any]]:
    return [r.row() for r in reports]


def write_entropy_report(reports: Sequence[PairReport], out_dir: str | Path) -> dict[str, Any]:
    """``entropy.json`` (with per-bin curves), ``entropy.md``, ``entropy.csv`` and ``entropy.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = entropy_table(reports)
    full = [{**r.row(), "bin_entropy": r.bin_entropy, "bin_stable": r.bin_stable} for r in reports]
    (out / "entropy.json").write_text(json.dumps({"pairs": full}, indent=2) + "\n", encoding="utf-8")
    (out / "entropy.md").write_text(entropy_markdown(reports), encoding="utf-8")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    (out / "entropy.csv").write_text(buffer.getvalue(), encoding="utf-8")
    curves = [(r.label, r.bin_entropy, [float("nan") if v is None else v for v in r.bin_stable]) for r in reports]
    plot = plots.stability_by_entropy(curves, out / "entropy.png")
    return {"pairs": full, "files": [str(out / n) for n in ("entropy.json", "entropy.md", "entropy.csv")] + [str(plot)]}


def entropy_markdown(reports: Sequence[PairReport]) -> str:
    def pct(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f}%"

    lines = [
        "| checkpoints | tokens | threshold (nats) | low / high | low-entropy stable | high-entropy rewritten | all stable |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        lines.append(
            f"| {r.label} | {r.n_tokens} | {r.threshold:.3f} | {r.n_low} / {r.n_high} | {pct(r.low_stable)} "
            f"| {pct(r.high_rewritten)} | {pct(r.stable)} |"
        )
    return "\n".join(lines) + "\n"
