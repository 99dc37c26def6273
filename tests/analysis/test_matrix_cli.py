"""``aclarena eval matrix`` from summaries or a curriculum manifest: files, numbers, plots."""

from __future__ import annotations

import json

import pytest

from aclarena_slime.analysis.sources import SourceError, from_manifest, infer_trained, load_summary
from aclarena_slime.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
STAGES = [
    ("stage1_math", {"math": 25.83, "search": 30.0}),
    ("stage2_search", {"math": 23.33, "search": 45.0}),
    ("stage3_retail", {"math": 6.04, "search": 40.0, "retail": 33.0}),
]


def _summary(path, stage, domains, **extra):
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets = {f"{d}_set": {"domain": d, "accuracy": v} for d, v in domains.items()}
    path.write_text(json.dumps({"stage": stage, "domains": domains, "datasets": datasets, **extra}))
    return path


def test_matrix_from_summaries_writes_tables_metrics_and_plots(tmp_path, capsys):
    paths = [_summary(tmp_path / s / "summary.json", s, d) for s, d in STAGES]
    base = _summary(tmp_path / "base.json", None, {"math": 20.0, "search": 28.0, "retail": 8.0})
    mle = _summary(tmp_path / "mle.json", "mle", {"math": 21.0, "search": 50.0, "retail": 32.0})
    oracle = _summary(tmp_path / "o.json", "oracle_search", {"math": 1.0, "search": 51.0, "retail": 2.0})
    out = tmp_path / "report"
    argv = ["eval", "matrix", *map(str, paths), "--base", str(base), "--mle", str(mle)]
    assert main([*argv, "--oracle", f"search={oracle}", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    metrics = report["matrix"]["metrics"]
    assert report["matrix"]["domains"] == ["math", "search", "retail"]
    assert report["matrix"]["trained"] == ["math", "search", "retail"]  # inferred from the stage names
    assert metrics["bwt"] == pytest.approx(((6.04 - 25.83) + (40.0 - 45.0)) / 2)
    # retail was not evaluated after stage 2, so its FWT term is skipped
    assert metrics["fwt_terms"] == pytest.approx({"search": 30.0 - 28.0}) and metrics["fwt"] == pytest.approx(2.0)
    assert metrics["max_forgetting"]["math"] == pytest.approx(25.83 - 6.04)
    assert metrics["average_accuracy"] == pytest.approx((6.04 + 40.0 + 33.0) / 3)
    for name in ("heatmap.png", "curves.png"):
        assert (out / name).read_bytes()[:8] == PNG and (out / name).stat().st_size > 5000
    for name in ("forgetting.md", "forgetting.csv", "forgetting.tex", "results.md", "results.csv", "results.tex"):
        assert (out / name).stat().st_size > 0
    results = (out / "results.md").read_text()
    assert "| + math (stage1_math) | 25.83 (25.83) | 30.00 | – | – |" in results  # paper's number beside ours
    assert "| Oracle (one model per task) | – | 51.00 (49.90) | – (33.20) | – |" in results
    assert "MLE (ours) | 21.00 (21.04) | 50.00 (49.70) | 32.00 (32.90) | 34.33 |" in results
    assert f"Backward transfer (BWT): {metrics['bwt']:.2f}" in (out / "forgetting.md").read_text()
    assert "Maximum forgetting, math: 19.79" in (out / "forgetting.md").read_text()


def test_matrix_from_manifest_skips_stages_not_evaluated_yet(tmp_path, capsys):
    _summary(tmp_path / "e1" / "summary.json", "whatever", STAGES[0][1])
    _summary(tmp_path / "e2" / "summary.json", "whatever", STAGES[1][1])
    _summary(tmp_path / "eb" / "summary.json", None, {"math": 20.0, "search": 28.0})
    manifest = {
        "stages": [
            {"name": "s1", "env": "math", "eval": "e1/summary.json"},
            {"name": "s2", "env": "search", "eval": "e2/summary.json"},
            {"name": "s3", "env": "retail", "eval": "e3/summary.json"},
        ],
        "base": {"eval": "eb/summary.json"},
    }
    (tmp_path / "curriculum.json").write_text(json.dumps(manifest))
    curriculum = from_manifest(tmp_path / "curriculum.json")
    assert [s.stage for s in curriculum.stages] == ["s1", "s2"] and curriculum.missing == ["s3"]
    matrix = curriculum.matrix()
    assert matrix.bwt() == pytest.approx(23.33 - 25.83) and matrix.fwt() == pytest.approx(30.0 - 28.0)
    out = tmp_path / "r"
    assert main(["eval", "matrix", "--manifest", str(tmp_path / "curriculum.json"), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "| s1 (trains math) | 25.83 | 30.00 | " in captured.out
    assert "without an eval summary yet: s3" in captured.err


def test_columns_by_dataset_and_explicit_list(tmp_path, capsys):
    paths = [_summary(tmp_path / f"{s}.json", s, d) for s, d in STAGES[:2]]
    out = tmp_path / "r"
    assert (
        main(["eval", "matrix", *map(str, paths), "--columns", "datasets", "--reference", "none", "--out", str(out)])
        == 0
    )
    header = (out / "results.csv").read_text().splitlines()[0]
    assert header == "group,key,method,math_set,search_set,Avg"
    capsys.readouterr()


def test_bad_inputs_are_user_errors(tmp_path, capsys):
    (tmp_path / "bad.json").write_text('{"domains": {"math": "high"}}')
    assert main(["eval", "matrix", str(tmp_path / "bad.json"), "--out", str(tmp_path / "o")]) == 2
    assert "not a number" in capsys.readouterr().err
    assert main(["eval", "matrix", "--out", str(tmp_path / "o")]) == 2
    assert "either --manifest or the stage summaries" in capsys.readouterr().err
    with pytest.raises(SourceError, match="cannot read eval summary"):
        load_summary(tmp_path / "absent.json")


def test_infer_trained_needs_exactly_one_match():
    assert infer_trained("stage2_search", ["math", "search"]) == "search"
    assert infer_trained("stage4_if", ["math", "ifeval"]) is None
    assert infer_trained("math_search_mix", ["math", "search"]) is None


def test_the_monitors_curves_become_a_plot_in_the_report(tmp_path, capsys):
    """Stages the forgetting monitor watched: monitor.json and monitor.png beside the matrix."""
    for stage in ("e1", "e2", "e3"):
        _summary(tmp_path / stage / "summary.json", stage, STAGES[0][1])
    alarm = {"domain": "math", "step": 4, "baseline": 25.0, "score": 10.0, "kept_step": 2, "drop": 15.0}
    watched = [
        {"curves": {"math": [[0, 25.0], [2, 24.0], [4, 10.0]]}, "alarms": [alarm], "rollouts": 4},
        {"curves": {"math": [[0, 12.0], [4, 11.0]], "search": [[0, 40.0], [4, 39.0]]}, "alarms": [], "rollouts": 4},
    ]
    manifest = {
        "stages": [
            {"name": "s1", "env": "math", "eval": "e1/summary.json"},
            {"name": "s2", "env": "search", "eval": "e2/summary.json", "monitor": watched[0]},
            {"name": "s3", "env": "retail", "eval": "e3/summary.json", "monitor": watched[1]},
        ]
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert [s for s, _ in from_manifest(tmp_path / "manifest.json").monitor] == ["s2", "s3"]
    out = tmp_path / "r"
    assert main(["eval", "matrix", "--manifest", str(tmp_path / "manifest.json"), "--out", str(out), "--json"]) == 0
    files = json.loads(capsys.readouterr().out)["files"]
    assert str(out / "monitor.png") in files and str(out / "monitor.json") in files
    assert (out / "monitor.png").read_bytes()[:8] == PNG and (out / "monitor.png").stat().st_size > 5000
    assert json.loads((out / "monitor.json").read_text())["s2"]["alarms"] == [alarm]
