"""Result tables laid out like the paper's: base, sequential-RL rows, oracles, MOPD, MLE; three formats.

Rows come in groups; each row has a stable ``key`` (``base``, ``seq:<trained domain>``, ``oracle``,
``mopd``, ``mle``) that a reference file (:data:`PAPER_REFERENCE`) uses to put the paper's number
beside ours: in parentheses in Markdown and LaTeX, in a ``<column> (paper)`` column in CSV. The
``Avg`` column is the mean over the row's columns, shown only when none is missing.
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

from aclarena_slime.analysis.forgetting import ForgettingMatrix
from aclarena_slime.analysis.sources import Curriculum, StageResult

PAPER_REFERENCE = Path(__file__).with_name("paper_reference.json")
AVG = "Avg"


@dataclass
class Row:
    key: str
    label: str
    group: str
    values: dict[str, float | None]


@dataclass
class Table:
    columns: list[str]
    rows: list[Row]
    titles: dict[str, str] = field(default_factory=dict)
    reference: dict[str, dict[str, float]] = field(default_factory=dict)  # row key -> column -> number
    reference_source: str = ""

    def title(self, column: str) -> str:
        return self.titles.get(column, column)

    def average(self, row: Row) -> float | None:
        values = [row.values.get(c) for c in self.columns]
        return mean(values) if values and all(v is not None for v in values) else None

    def paper(self, row: Row, column: str) -> float | None:
        return self.reference.get(row.key, {}).get(column)

    def has_reference(self, column: str) -> bool:
        return any(self.paper(r, column) is not None for r in self.rows)


@dataclass(frozen=True)
class Reference:
    rows: dict[str, dict[str, float]]
    titles: dict[str, str]
    source: str


def load_reference(path: str | Path = PAPER_REFERENCE) -> Reference:
    data = json.loads(Path(path).read_text())
    rows = {k: {c: float(v) for c, v in cols.items()} for k, cols in (data.get("rows") or {}).items()}
    return Reference(rows, dict(data.get("titles") or {}), str(data.get("source", "")))


def paper_table(
    curriculum: Curriculum,
    columns: Sequence[str],
    oracles: Mapping[str, StageResult] | None = None,
    methods: Sequence[tuple[str, str, StageResult]] = (),
    reference: Reference | None = None,
) -> Table:
    """The paper's layout. ``oracles``: domain -> that domain's independently trained model's result;
    the oracle row takes each column from the oracle of the column's domain. ``methods``:
    ``(key, label, result)`` rows of their own group (MOPD, MLE)."""
    rows: list[Row] = []
    if curriculum.base is not None:
        rows.append(Row("base", "Base model", "Base", _values(curriculum.base, columns)))
    for stage in curriculum.stages:
        name = stage.trained or stage.stage
        rows.append(Row(f"seq:{name}", f"+ {name} ({stage.stage})", "Sequential RL", _values(stage, columns)))
    if oracles:
        owners = {c: _domain_of(c, [*curriculum.stages, *oracles.values()]) for c in columns}
        values = {c: oracles[owners[c]].column(c) if owners[c] in oracles else None for c in columns}
        rows.append(Row("oracle", "Oracle (one model per task)", "Oracles", values))
    for key, label, result in methods:
        rows.append(Row(key, label, label, _values(result, columns)))
    return Table(
        list(columns),
        rows,
        titles=dict(reference.titles) if reference else {},
        reference=dict(reference.rows) if reference else {},
        reference_source=reference.source if reference else "",
    )


def matrix_table(matrix: ForgettingMatrix, titles: Mapping[str, str] | None = None) -> Table:
    """The forgetting matrix itself: base row, then one row per stage."""
    rows = []
    if matrix.base is not None:
        rows.append(Row("base", "Base model", "", dict(zip(matrix.domains, matrix.base, strict=True))))
    for stage, trained, values in zip(matrix.stages, matrix.trained, matrix.values, strict=True):
        label = f"{stage} (trains {trained})" if trained else stage
        rows.append(Row(f"seq:{trained or stage}", label, "", dict(zip(matrix.domains, values, strict=True))))
    return Table(list(matrix.domains), rows, titles=dict(titles or {}))


def _values(result: StageResult, columns: Sequence[str]) -> dict[str, float | None]:
    return {c: result.column(c) for c in columns}


def _domain_of(column: str, results: Sequence[StageResult]) -> str:
    for result in results:
        if column in result.datasets:
            return result.domain_of(column)
    return column


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _groups(table: Table) -> list[tuple[str, list[Row]]]:
    groups: list[tuple[str, list[Row]]] = []
    for row in table.rows:
        if not groups or groups[-1][0] != row.group:
            groups.append((row.group, []))
        groups[-1][1].append(row)
    return groups


def to_markdown(table: Table) -> str:
    header = ["Method", *(table.title(c) for c in table.columns), AVG]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group, rows in _groups(table):
        if group:
            lines.append(f"| **{group}** |" + " |" * (len(header) - 1))
        for row in rows:
            cells = [_md_cell(row.values.get(c), table.paper(row, c)) for c in table.columns]
            lines.append("| " + " | ".join([row.label, *cells, _fmt(table.average(row))]) + " |")
    if table.reference:
        lines += ["", f"In parentheses: the paper's number ({table.reference_source})."]
    return "\n".join(lines) + "\n"


def _md_cell(ours: float | None, paper: float | None) -> str:
    return _fmt(ours) if paper is None else f"{_fmt(ours)} ({paper:.2f})"


def to_csv(table: Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    paper_cols = [c for c in table.columns if table.has_reference(c)]
    writer.writerow(["group", "key", "method", *table.columns, AVG, *(f"{c} (paper)" for c in paper_cols)])
    for row in table.rows:
        ours = [_csv(row.values.get(c)) for c in table.columns]
        papers = [_csv(table.paper(row, c)) for c in paper_cols]
        writer.writerow([row.group, row.key, row.label, *ours, _csv(table.average(row)), *papers])
    return out.getvalue()


def _csv(value: float | None) -> str:
    return "" if value is None else repr(round(value, 6))


_LATEX_SPECIAL = {c: f"\\{c}" for c in "&%$#_{}"} | {
    "~": r"\textasciitilde{}",
    "^": r"\^{}",
    "\\": r"\textbackslash{}",
    "τ": r"$\tau$",  # τ³-Retail, so the table compiles with pdflatex too
    "³": r"$^3$",
}


def _tex(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def to_latex(table: Table, caption: str = "") -> str:
    width = len(table.columns) + 2
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{_tex(caption)}}}")
    lines += [
        r"\begin{tabular}{l" + "c" * (width - 1) + "}",
        r"\toprule",
        " & ".join(["Method", *(_tex(table.title(c)) for c in table.columns), AVG]) + r" \\",
        r"\midrule",
    ]
    for number, (group, rows) in enumerate(_groups(table)):
        if number:
            lines.append(r"\midrule")
        if group:
            lines.append(rf"\multicolumn{{{width}}}{{l}}{{\textit{{{_tex(group)}}}}} \\")
        for row in rows:
            cells = [_tex_cell(row.values.get(c), table.paper(row, c)) for c in table.columns]
            lines.append(" & ".join([_tex(row.label), *cells, _tex(_fmt(table.average(row)))]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if table.reference:
        lines.append(rf"\\[2pt]{{\footnotesize In parentheses: the paper's number ({_tex(table.reference_source)}).}}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def _tex_cell(ours: float | None, paper: float | None) -> str:
    cell = _tex(_fmt(ours))
    return cell if paper is None else rf"{cell} {{\scriptsize({paper:.2f})}}"


def metrics_markdown(metrics: Mapping[str, Any]) -> str:
    """ACC, BWT, FWT and per-domain maximum forgetting as a short Markdown list."""
    lines = [
        f"- Average accuracy (final stage): {_fmt(metrics.get('average_accuracy'))}",
        f"- Backward transfer (BWT): {_fmt(metrics.get('bwt'))}",
        f"- Forward transfer (FWT): {_fmt(metrics.get('fwt'))}",
    ]
    for domain, value in (metrics.get("max_forgetting") or {}).items():
        lines.append(f"- Maximum forgetting, {domain}: {_fmt(value)}")
    return "\n".join(lines) + "\n"
