"""Forgetting matrix metrics against numbers computed by hand."""

from __future__ import annotations

import pytest

from aclarena_slime.analysis.forgetting import ForgettingMatrix, MatrixError

DOMAINS = ["math", "search", "retail", "ifeval"]
ROWS = [
    ("stage1_math", "math", {"math": 25.83, "search": 30.0, "retail": 10.0, "ifeval": 40.0}),
    ("stage2_search", "search", {"math": 23.33, "search": 45.0, "retail": 12.0, "ifeval": 38.0}),
    ("stage3_retail", "retail", {"math": 6.04, "search": 40.0, "retail": 33.0, "ifeval": 35.0}),
    ("stage4_if", "ifeval", {"math": 10.21, "search": 42.0, "retail": 30.0, "ifeval": 80.0}),
]
BASE = {"math": 20.0, "search": 28.0, "retail": 8.0, "ifeval": 36.0}


def test_metrics_match_hand_computation():
    m = ForgettingMatrix.from_rows(ROWS, base=BASE)
    assert list(m.domains) == DOMAINS  # trained domains, in stage order
    # ACC: mean of the last row
    assert m.average_accuracy() == pytest.approx((10.21 + 42 + 30 + 80) / 4)
    # BWT: (10.21-25.83) + (42-45) + (30-33), over 3 domains
    assert m.bwt_terms() == pytest.approx({"math": -15.62, "search": -3.0, "retail": -3.0})
    assert m.bwt() == pytest.approx(-21.62 / 3)
    # FWT: search before its stage 30-28, retail 12-8, ifeval 35-36
    assert m.fwt_terms() == pytest.approx({"search": 2.0, "retail": 4.0, "ifeval": -1.0})
    assert m.fwt() == pytest.approx(5.0 / 3)
    # max forgetting: math drops to 6.04 after retail; the last-trained domain has none
    forgetting = m.max_forgetting()
    assert forgetting["math"] == pytest.approx(25.83 - 6.04)
    assert forgetting["search"] == pytest.approx(5.0) and forgetting["retail"] == pytest.approx(3.0)
    assert forgetting["ifeval"] is None
    assert m.to_dict()["metrics"]["bwt"] == m.bwt()


def test_without_base_there_is_no_fwt_and_missing_cells_are_skipped():
    rows = [(s, t, dict(v)) for s, t, v in ROWS]
    del rows[0][2]["math"]  # stage 1 never evaluated on math
    m = ForgettingMatrix.from_rows(rows, domains=DOMAINS)
    assert m.fwt() is None and m.fwt_terms() == {}
    assert m.bwt_terms() == pytest.approx({"search": -3.0, "retail": -3.0})
    assert m.max_forgetting()["math"] is None
    assert m.at(0, "math") is None


def test_extra_columns_and_unknown_trained_domains():
    rows = [("a", None, {"x": 1.0, "y": 2.0}), ("b", "x", {"x": 3.0, "y": 1.0, "z": 5.0})]
    m = ForgettingMatrix.from_rows(rows)
    assert list(m.domains) == ["x", "y", "z"]
    assert m.bwt() is None  # no trained domain before the last stage
    assert m.average_accuracy() == pytest.approx(3.0)


def test_shape_errors():
    with pytest.raises(MatrixError, match="at least one stage"):
        ForgettingMatrix((), (), ("a",), ())
    with pytest.raises(MatrixError, match="one value per domain"):
        ForgettingMatrix(("s",), ("a",), ("a", "b"), ((1.0,),))
