"""The comparison's figures: one heatmap, and several methods' side by side (the arena benchmark's)."""

from __future__ import annotations

import struct

import pytest

from aclarena_slime.analysis import plots
from aclarena_slime.analysis.forgetting import ForgettingMatrix


def _matrix(first: float, missing: bool = False) -> ForgettingMatrix:
    rows = [
        ("math", "math", {"math": first, "ifeval": 3.1}),
        ("ifeval", "ifeval", {"math": 0.0, "ifeval": None if missing else 33.3}),
    ]
    return ForgettingMatrix.from_rows(rows, domains=["math", "ifeval"])


def _size(path) -> tuple[int, int]:
    """A PNG's width and height, from its IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_side_by_side_heatmaps_are_one_figure_a_panel_wide_each(tmp_path):
    one = _size(plots.heatmap(_matrix(11.5), tmp_path / "one.png"))
    panels = [("sequential (mean of 3 seeds)", _matrix(11.5)), ("mle", _matrix(9.4, missing=True))]
    two = _size(plots.heatmaps(panels, tmp_path / "two.png"))
    assert two[0] == 2 * one[0]  # a panel per method, each as wide as a single heatmap
    assert two[1] > one[1]  # room for the panels' titles


def test_side_by_side_heatmaps_need_a_panel(tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        plots.heatmaps([], tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()
