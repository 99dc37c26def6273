"""The expert manifest: lookup, default, validation and paths kept inside the experts' folder."""

from __future__ import annotations

import json

import pytest

from aclarena_slime.experts import ExpertError, ExpertTable, UnknownExpert

MANIFEST = {
    "version": 1,
    "base": {"name": "qwen3-8b-sdft", "path": "backbone"},
    "experts": {
        "math": {"adapter": "math", "path": "experts/math", "stage": "stage1_math"},
        "search": {"adapter": "search", "path": "experts/search", "stage": "stage2_search"},
    },
    "default": None,
}


def test_load_resolve_and_round_trip(tmp_path):
    (tmp_path / "experts.json").write_text(json.dumps(MANIFEST))
    table = ExpertTable.load(tmp_path / "experts.json")
    assert table.adapter_for("search") == "search"
    assert table.lookup("math").path == (tmp_path / "experts/math").resolve()
    assert table.base_path == tmp_path.resolve() / "backbone"
    assert table.to_mapping()["experts"] == MANIFEST["experts"]
    with pytest.raises(UnknownExpert, match="known tags: math, search"):
        table.lookup("retail")


def test_default_expert_and_short_form():
    table = ExpertTable.from_mapping({**MANIFEST, "default": "math"})
    assert table.adapter_for(None) == "math"
    with pytest.raises(UnknownExpert, match="environment tag 'retail'; known tags: math, search"):
        table.adapter_for("retail")  # the default serves untagged requests only, never a misspelt tag
    assert ExpertTable.from_mapping({"ifeval": "if-expert"}).adapter_for("ifeval") == "if-expert"
    with pytest.raises(ExpertError, match="default expert 'x'"):
        ExpertTable.from_mapping({**MANIFEST, "default": "x"})


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "experts/../../outside"])
def test_paths_outside_the_manifest_folder_are_refused(tmp_path, path):
    bad = {"version": 1, "experts": {"math": {"adapter": "math", "path": path}}}
    with pytest.raises(ExpertError, match="outside the experts' directory"):
        ExpertTable.from_mapping(bad, root=tmp_path)


@pytest.mark.parametrize("name", ["../x", "a/b", "", "x" * 200, "name with space"])
def test_bad_adapter_names_are_refused(name):
    with pytest.raises(ExpertError, match="invalid adapter name"):
        ExpertTable.from_mapping({"math": name})


def test_save_writes_what_load_reads_and_keeps_outside_paths_absolute(tmp_path):
    """The one writer: relative paths inside the folder, an absolute base elsewhere kept absolute."""
    outside = tmp_path / "models" / "base-hf"
    table = ExpertTable.from_mapping({**MANIFEST, "base": {"name": "b", "path": str(outside)}}, root=tmp_path / "out")
    table.save(tmp_path / "out" / "experts.json")
    written = json.loads((tmp_path / "out" / "experts.json").read_text())
    assert written["experts"] == MANIFEST["experts"] and written["base"] == {"name": "b", "path": str(outside)}
    again = ExpertTable.load(tmp_path / "out" / "experts.json")
    assert again.to_mapping() == written and again.base_path == outside


@pytest.mark.parametrize(
    "manifest, words",
    [
        ({"version": 1, "experts": {"math": 5}}, "expert 'math': expected an adapter name or an object"),
        ({"version": 1, "experts": {"math": ["a"]}}, "expert 'math'"),
        ({"version": 1, "experts": {"math": {"adapter": "math", "path": 3}}}, "expert 'math'"),
        ({"version": 1, "experts": ["math"]}, "'experts' and 'base' are JSON objects"),
        ({"version": 1, "base": "b", "experts": {}}, "'experts' and 'base' are JSON objects"),
        (["math"], "is a JSON object, got list"),
        ({"math": 5}, "expert 'math'"),
    ],
)
def test_a_malformed_manifest_is_an_expert_error_not_a_traceback(tmp_path, manifest, words):
    """serve-router turns an ExpertError into a one-line error; anything else was a traceback."""
    (tmp_path / "experts.json").write_text(json.dumps(manifest))
    with pytest.raises(ExpertError, match=words):
        ExpertTable.load(tmp_path / "experts.json")
