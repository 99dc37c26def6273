"""``aclarena eval matrix --run METHOD=PATH ...``: one comparison table across methods."""

from __future__ import annotations

import json

import pytest

from aclarena_slime.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def _run(root, name, rows, costs, start_from=True):
    """A curriculum output folder: manifest + one eval summary per stage (two domains, two stages).

    ``start_from``: each stage continues the one before (a chain), else each starts from the base (oracles).
    """
    stages, before = [], None
    for (stage, env, domains), cost in zip(rows, costs, strict=True):
        summary = root / name / "eval" / stage / "summary.json"
        summary.parent.mkdir(parents=True)
        summary.write_text(json.dumps({"stage": stage, "domains": domains}))
        stages.append({"name": stage, "env": env, "eval": {"summary": f"eval/{stage}/summary.json"}, "cost": cost,
                       "start_from": before if start_from else None})  # fmt: skip
        before = stage
    manifest = root / name / "manifest.json"
    manifest.write_text(json.dumps({"name": name, "stages": stages}))
    return manifest


def test_one_command_compares_curricula_and_single_models(tmp_path, capsys):
    local = {"rollout_tokens": 1000, "trainer_steps": 2}
    seq = _run(tmp_path, "seq", [("s1", "a", {"a": 50.0, "b": 10.0}), ("s2", "b", {"a": 20.0, "b": 60.0})], [local] * 2)
    replay = _run(tmp_path, "rep", [("r1", "a", {"a": 50.0, "b": 12.0}), ("r2", "b", {"a": 45.0, "b": 55.0})],
                  [local, {"rollout_tokens": 1500, "trainer_steps": 2}])  # fmt: skip
    slime = {"rollout_tokens": None, "trainer_steps": 300}
    anchor = _run(
        tmp_path, "kl", [("k1", "a", {"a": 50.0, "b": 10.0}), ("k2", "b", {"a": 40.0, "b": 58.0})], [slime] * 2
    )
    mopd = tmp_path / "mopd.json"
    mopd.write_text(json.dumps({"stage": "mopd", "domains": {"a": 44.0, "b": 52.0}}))
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"stage": "base", "domains": {"a": 5.0, "b": 4.0}}))
    out = tmp_path / "cmp"
    runs = ["--run", f"sequential={seq}", "--run", f"replay={replay}", "--run", f"KL anchor={anchor}"]
    assert (
        main(["eval", "matrix", *runs, "--run", f"MOPD={mopd}", "--base", str(base), "--out", str(out), "--json"]) == 0
    )
    methods = {m["method"]: m for m in json.loads(capsys.readouterr().out)["methods"]}
    assert list(methods) == ["sequential", "replay", "KL anchor", "MOPD"]
    assert methods["sequential"]["average_accuracy"] == pytest.approx(40.0)
    assert methods["sequential"]["bwt"] == pytest.approx(-30.0) and methods["replay"]["bwt"] == pytest.approx(-5.0)
    assert methods["sequential"]["fwt"] == pytest.approx(10.0 - 4.0)  # b before its stage vs the base model
    assert methods["sequential"]["max_forgetting"] == pytest.approx(30.0)
    assert methods["replay"]["rollout_tokens"] == 2500 and methods["replay"]["trainer_steps"] == 4
    assert methods["KL anchor"]["rollout_tokens"] is None and methods["KL anchor"]["trainer_steps"] == 600
    assert methods["MOPD"] == {"method": "MOPD", "average_accuracy": 48.0, "stages": 0, "missing_stages": [],
                               "domains": {"a": 44.0, "b": 52.0}, "independent": False}  # fmt: skip
    markdown = (out / "comparison.md").read_text()
    assert "| replay | 50.00 | -5.00 | 8.00 | 5.00 | 2,500 | 4 |" in markdown
    assert "| KL anchor | 49.00 | -10.00 | 6.00 | 10.00 | – | 600 |" in markdown
    assert "sequential,40.0,-30.0,6.0,30.0,2000,4,2," in (out / "comparison.csv").read_text()
    tex = (out / "comparison.tex").read_text()
    assert r"\toprule" in tex and "KL anchor & 49.00 & -10.00 & 6.00 & 10.00 & -- & 600" in tex
    assert (out / "comparison.png").read_bytes()[:8] == PNG


def test_comparison_inputs_are_checked(tmp_path, capsys):
    assert main(["eval", "matrix", "--run", f"x={tmp_path / 'absent.json'}", "--out", str(tmp_path / "o")]) == 2
    assert "x: cannot read" in capsys.readouterr().err
    (tmp_path / "s.json").write_text(json.dumps({"domains": {"a": 1.0}}))
    argv = ["eval", "matrix", str(tmp_path / "s.json"), "--run", f"x={tmp_path / 's.json'}", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "--run compares whole runs" in capsys.readouterr().err


def test_each_curriculum_gets_its_matrix_heatmap_and_curves_and_oracles_compare_by_their_diagonal(tmp_path, capsys):
    cost = {"rollout_tokens": 10, "trainer_steps": 1}
    seq = _run(tmp_path, "seq", [("s1", "a", {"a": 50.0, "b": 10.0}), ("s2", "b", {"a": 20.0, "b": 60.0})], [cost] * 2)
    oracles = _run(tmp_path, "orc", [("o1", "a", {"a": 55.0, "b": 0.0}), ("o2", "b", {"a": 0.0, "b": 65.0})],
                   [cost] * 2, start_from=False)  # fmt: skip
    out = tmp_path / "cmp"
    runs = ["--run", f"sequential={seq}", "--run", f"my method={oracles}"]
    assert main(["eval", "matrix", *runs, "--out", str(out), "--json"]) == 0
    methods = {m["method"]: m for m in json.loads(capsys.readouterr().out)["methods"]}
    assert methods["my method"]["independent"] and methods["my method"]["domains"] == {"a": 55.0, "b": 65.0}
    assert methods["my method"]["average_accuracy"] == pytest.approx(60.0)  # the diagonal, not the last row
    assert methods["my method"].get("bwt") is None  # no chain, no transfer
    assert methods["sequential"]["domains"] == {"a": 20.0, "b": 60.0} and not methods["sequential"]["independent"]
    assert "| my method | 0.00 | 65.00 |" not in (out / "comparison.md").read_text()
    assert "| my method | 55.00 | 65.00 |" in (out / "comparison.md").read_text()
    for folder in ("sequential", "my_method"):
        assert (out / folder / "heatmap.png").read_bytes()[:8] == PNG
        assert (out / folder / "curves.png").read_bytes()[:8] == PNG
    matrix = json.loads((out / "sequential" / "matrix.json").read_text())
    assert matrix["values"] == [[50.0, 10.0], [20.0, 60.0]]
