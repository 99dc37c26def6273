"""PNG figures: the forgetting heatmap, per-domain curves across stages, entropy-vs-stability curves.

Matplotlib with the Agg backend (no display needed); each function writes one file and returns its path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
import numpy as np  # noqa: E402

from aclarena_slime.analysis.forgetting import ForgettingMatrix  # noqa: E402


def _rows(matrix: ForgettingMatrix) -> tuple[list[str], np.ndarray]:
    labels = (["base"] if matrix.base is not None else []) + list(matrix.stages)
    rows = ([matrix.base] if matrix.base is not None else []) + list(matrix.values)
    return labels, np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


def heatmap(matrix: ForgettingMatrix, path: str | Path, titles: Mapping[str, str] | None = None) -> Path:
    """Stage × domain accuracy, one annotated cell each; missing cells blank."""
    return heatmaps([("", matrix)], path, titles)


def heatmaps(
    panels: Sequence[tuple[str, ForgettingMatrix]], path: str | Path, titles: Mapping[str, str] | None = None
) -> Path:
    """Several methods' heatmaps side by side on one colour scale, each under its title: the comparison at a
    glance (the README's figure is the arena benchmark's)."""
    if not panels:
        raise ValueError("heatmaps needs at least one (title, matrix) panel")
    grids = [(title, matrix, *_rows(matrix)) for title, matrix in panels]
    grids = [(title, matrix, [(titles or {}).get(label, label) for label in labels], data)  # a stage named by its domain
             for title, matrix, labels, data in grids]  # fmt: skip
    cells = np.concatenate([data.ravel() for *_, data in grids])
    top = max(100.0, float(np.nanmax(cells))) if np.isfinite(cells).any() else 100.0
    width = max(1.3 * len(matrix.domains) + 2.5 for _, matrix in panels)
    height = max(0.6 * len(labels) + 1.8 for _, _, labels, _ in grids) + (0.4 if any(t for t, _ in panels) else 0)
    fig, axes = plt.subplots(1, len(grids), figsize=(width * len(grids), height), squeeze=False)
    for ax, (title, matrix, labels, data) in zip(axes[0], grids, strict=True):
        columns = [(titles or {}).get(d, d) for d in matrix.domains]
        image = ax.imshow(np.ma.masked_invalid(data), cmap="viridis", aspect="auto", vmin=0, vmax=top)
        ax.set_xticks(range(len(columns)), labels=columns, rotation=30, ha="right")
        ax.set_yticks(range(len(labels)), labels=labels)
        for (i, j), value in np.ndenumerate(data):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.1f}", ha="center", va="center", color="white" if value < 60 else "black")
        ax.set_xlabel("evaluated domain")
        ax.set_ylabel("after stage")
        if title:
            ax.set_title(title)
        fig.colorbar(image, ax=ax, label="accuracy (%)")
    fig.tight_layout()
    return _save(fig, path)


def domain_curves(matrix: ForgettingMatrix, path: str | Path, titles: Mapping[str, str] | None = None) -> Path:
    """One line per domain: accuracy after each stage (base first when known)."""
    labels, data = _rows(matrix)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(labels) + 2), 4))
    for j, domain in enumerate(matrix.domains):
        ax.plot(range(len(labels)), data[:, j], marker="o", label=(titles or {}).get(domain, domain))
    ax.set_xticks(range(len(labels)), labels=labels, rotation=20, ha="right")
    ax.set_ylabel("accuracy (%)")
    ax.set_title("accuracy per domain across the curriculum")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, path)


def monitor_curves(
    stages: Sequence[tuple[str, Mapping[str, Any]]], path: str | Path, titles: Mapping[str, str] | None = None
) -> Path:
    """The forgetting monitor's curves: each earlier domain's score against training step, stages side by side.

    ``stages``: ``(stage, monitor report)`` in training order; a report has ``curves`` (domain -> [[step,
    score], ...]), ``rollouts`` (the stage's length) and ``alarms``. Steps count over the watched stages;
    a dashed line marks where each begins, a cross each alarm.
    """
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(stages) + 2), 4))
    colours: dict[str, Any] = {}
    offset = 0
    for stage, report in stages:
        ax.axvline(offset, color="grey", linestyle="--", linewidth=0.8)
        ax.annotate(stage, (offset, 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top", fontsize=7)
        curves = report.get("curves") or {}
        for domain, points in curves.items():
            xs, ys = [offset + s for s, _ in points], [v for _, v in points]
            label = None if domain in colours else (titles or {}).get(domain, domain)
            (line,) = ax.plot(xs, ys, marker="o", markersize=3, color=colours.get(domain), label=label)
            colours.setdefault(domain, line.get_color())
        for alarm in report.get("alarms") or []:
            ax.plot(offset + alarm["step"], alarm["score"], marker="x", markersize=9, color="red")
        last = max((s for points in curves.values() for s, _ in points), default=0)
        offset += int(report.get("rollouts") or last)
    ax.set_xlabel("training step (rollouts, watched stages)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title("earlier domains while each stage trains (x: forgetting alarm)")
    ax.grid(alpha=0.3)
    if colours:
        ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, path)


def method_bars(methods: Sequence[tuple[str, Mapping[str, Any]]], path: str | Path) -> Path:
    """The comparison at a glance: average accuracy, BWT and maximum forgetting per method (points)."""
    metrics = (("average_accuracy", "avg accuracy"), ("bwt", "BWT"), ("max_forgetting", "max forgetting"))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(methods) + 2), 4))
    width = 0.8 / len(metrics)
    positions = np.arange(len(methods))
    for i, (key, label) in enumerate(metrics):
        values = [np.nan if m.get(key) is None else float(m[key]) for _, m in methods]
        ax.bar(positions + (i - (len(metrics) - 1) / 2) * width, values, width, label=label)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(positions, labels=[name for name, _ in methods], rotation=20, ha="right")
    ax.set_ylabel("points")
    ax.set_title("continual-learning methods compared")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, path)


def stability_by_entropy(curves: Sequence[tuple[str, Sequence[float], Sequence[float]]], path: str | Path) -> Path:
    """Share of tokens whose top choice survives the next stage, per entropy bin; one line per stage pair.

    ``curves``: ``(label, bin centres in nats, stable share in percent)``.
    """
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, centres, stable in curves:
        ax.plot(centres, stable, marker="o", label=label)
    ax.set_xlabel("token entropy under checkpoint k (nats)")
    ax.set_ylabel("top choice unchanged at k+1 (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, path)


def _save(fig: plt.Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
