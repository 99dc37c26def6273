"""The prompt generator and the conversions into slime JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aclarena_envs.ifeval.checkers import INSTRUCTIONS
from aclarena_envs.ifeval.data import main
from aclarena_envs.ifeval.generator import compatible, generate
from aclarena_envs.ifeval.reward import Label

IFEVAL_RECORD = {
    "key": 7,
    "prompt": "Write a riddle. Do not use commas.",
    "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
    "kwargs": [{}, {"num_words": 30, "relation": "less than"}],
}
RLVR_RECORD = {
    "messages": [{"role": "user", "content": "Describe tea. Use a title."}],
    # open-instruct writes the ground truth as a Python repr of a one-element list
    "ground_truth": str([{"instruction_id": ["detectable_format:title"], "kwargs": [None]}]),
    "dataset": "ifeval",
    "constraint_type": "title",
}


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generator_is_seeded_and_covers_the_registry() -> None:
    first = [(p.prompt, p.label) for p in generate(300, seed=3)]
    assert first == [(p.prompt, p.label) for p in generate(300, seed=3)]
    assert first != [(p.prompt, p.label) for p in generate(300, seed=4)]
    used = {i for _, label in first for i in label.instruction_ids}
    assert used == set(INSTRUCTIONS)


def test_generated_labels_are_consistent() -> None:
    for prompt in generate(300, seed=9, max_instructions=5):
        ids = prompt.label.instruction_ids
        assert 1 <= len(ids) <= 5
        assert all(compatible(a, b) for n, a in enumerate(ids) for b in ids[n + 1 :])
        prompt.label.checkers()  # builds: kwargs are accepted
        kwargs = dict(zip(ids, prompt.label.kwargs, strict=True))
        if "combination:repeat_prompt" in kwargs:
            assert prompt.prompt.startswith(kwargs["combination:repeat_prompt"]["prompt_to_repeat"])
        required = set(kwargs.get("keywords:existence", {}).get("keywords", []))
        assert not required & set(kwargs.get("keywords:forbidden_words", {}).get("forbidden_words", []))


def test_generate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gen.jsonl"
    assert main(["generate", "--output", str(out), "--count", "20", "--seed", "1"]) == 0
    records = _read(out)
    assert len(records) == 20 and json.loads(capsys.readouterr().out)["written"] == 20
    assert all(r["metadata"]["env"] == "ifeval" for r in records)
    assert all(Label.parse(r["label"]).checkers() for r in records)


def test_ifeval_conversion(tmp_path: Path) -> None:
    out = tmp_path / "eval.jsonl"
    assert main(["ifeval", "--input", str(_write(tmp_path / "in.jsonl", [IFEVAL_RECORD])), "--output", str(out)]) == 0
    (record,) = _read(out)
    assert record["prompt"] == IFEVAL_RECORD["prompt"]
    assert record["metadata"] == {"env": "ifeval", "source": "ifeval", "key": 7}
    assert Label.parse(record["label"]) == Label.parse(IFEVAL_RECORD)


def test_rlvr_conversion(tmp_path: Path) -> None:
    with_system = dict(RLVR_RECORD, messages=[{"role": "system", "content": "Be brief."}, *RLVR_RECORD["messages"]])
    source = _write(tmp_path / "in.jsonl", [RLVR_RECORD, with_system])
    out = tmp_path / "train.jsonl"
    assert main(["rlvr", "--input", str(source), "--output", str(out)]) == 0
    plain, chat = _read(out)
    assert plain["prompt"] == "Describe tea. Use a title."
    assert [m["role"] for m in chat["prompt"]] == ["system", "user"]
    assert Label.parse(plain["label"]).instruction_ids == ("detectable_format:title",)
    assert plain["metadata"] == {"env": "ifeval", "source": "ifeval", "constraint_type": "title"}


def test_bad_records_stop_the_conversion_or_are_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old_style = dict(RLVR_RECORD, ground_truth=json.dumps({"func_name": "validate_lowercase", "N": None}))
    unknown = dict(RLVR_RECORD, ground_truth=json.dumps([{"instruction_id": ["count:word_count"], "kwargs": [{}]}]))
    inner_not_json = dict(RLVR_RECORD, ground_truth=json.dumps(["{not json"]))
    source = _write(tmp_path / "in.jsonl", [RLVR_RECORD, old_style, unknown, inner_not_json])
    out = tmp_path / "train.jsonl"
    assert main(["rlvr", "--input", str(source), "--output", str(out)]) == 2
    assert "in.jsonl:2" in capsys.readouterr().err and not out.exists()
    assert main(["rlvr", "--input", str(source), "--output", str(out), "--skip-invalid"]) == 0
    assert json.loads(capsys.readouterr().out) == {"written": 1, "skipped": 3, "output": str(out)}


def test_inner_ground_truth_text_may_be_json_or_a_python_literal(tmp_path: Path) -> None:
    inner = str({"instruction_id": ["detectable_format:title"], "kwargs": [None]})  # a repr, inside a JSON list
    source = _write(tmp_path / "in.jsonl", [dict(RLVR_RECORD, ground_truth=json.dumps([inner]))])
    assert main(["rlvr", "--input", str(source), "--output", str(tmp_path / "o.jsonl")]) == 0
    [record] = _read(tmp_path / "o.jsonl")
    assert Label.parse(record["label"]).instruction_ids == ("detectable_format:title",)


def test_not_json_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(IFEVAL_RECORD) + "\n{oops\n")
    assert main(["ifeval", "--input", str(source), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "in.jsonl:2: not JSON" in capsys.readouterr().err
