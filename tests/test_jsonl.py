"""JSONL: errors name file and line; an interrupted write keeps the good file that was there."""

from __future__ import annotations

import json

import pytest

from aclarena_slime.jsonl import JsonlError, iter_jsonl, write_json_atomic, write_jsonl_atomic


def test_round_trip_skips_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    assert write_jsonl_atomic([{"a": 1}, {"b": "é"}], path) == 2
    path.write_text(path.read_text() + "\n\n")
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (2, {"b": "é"})]


@pytest.mark.parametrize(
    ("text", "message"),
    [('{"a": 1}\n{oops\n', "d.jsonl:2: not JSON"), ("[1, 2]\n", "d.jsonl:1: expected a JSON object")],
)
def test_bad_lines_are_located(tmp_path, text, message):
    (tmp_path / "d.jsonl").write_text(text)
    with pytest.raises(JsonlError, match=message):
        list(iter_jsonl(tmp_path / "d.jsonl"))


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "d.jsonl"
    write_jsonl_atomic([{"good": True}], path)

    def records():
        yield {"new": 1}
        raise RuntimeError("conversion failed half-way")

    with pytest.raises(RuntimeError):
        write_jsonl_atomic(records(), path)
    assert list(iter_jsonl(path)) == [(1, {"good": True})]
    assert [p.name for p in tmp_path.iterdir()] == ["d.jsonl"]


def test_json_document_is_replaced_whole(tmp_path):
    import json

    path = tmp_path / "sub" / "metrics.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"b": "é"})
    assert json.loads(path.read_text()) == {"b": "é"}
    assert [p.name for p in path.parent.iterdir()] == ["metrics.json"]


@pytest.mark.parametrize("write", ["json", "jsonl"])
def test_two_writers_of_one_file_never_trip_over_each_others_temp_file(tmp_path, write):
    """Two runs writing one manifest at once (one fixed temp name: one renames the other's half-written file,
    or finds its own gone). Each write lands whole, and no temp file is left behind."""
    import threading

    path = tmp_path / "manifest.json"
    errors: list[BaseException] = []

    def writer(who: int) -> None:
        try:
            for i in range(150):
                doc = {"who": who, "i": i, "pad": "x" * 20000}
                write_json_atomic(path, doc) if write == "json" else write_jsonl_atomic([doc], path)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(who,)) for who in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    text = path.read_text()
    assert json.loads(text if write == "json" else text.splitlines()[0])["i"] == 149
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
