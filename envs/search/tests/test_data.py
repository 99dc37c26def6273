"""Data preparation: Search-R1's parquet into slime JSONL, the demo set, and errors that name the input."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aclarena_envs.search.data import hop_of, main
from aclarena_envs.search.env import SearchEnvironment
from aclarena_slime.plugin.contract import Task


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_search_r1_parquet_becomes_slime_jsonl(tmp_path, capsys):
    # The columns of Search-R1's nq_hotpotqa_train parquet (golden_answers is a list column).
    table = pa.table(
        {
            "id": ["train_0", "train_1"],
            "question": ["who wrote hamlet", "which band released abbey road?"],
            "golden_answers": [["William Shakespeare", "Shakespeare"], ["The Beatles"]],
            "data_source": ["nq", "hotpotqa"],
        }
    )
    pq.write_table(table, tmp_path / "train.parquet")
    assert (
        main(["--input", str(tmp_path / "train.parquet"), "--output", str(tmp_path / "out.jsonl"), "--split", "train"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["written"] == 2
    first, second = _records(tmp_path / "out.jsonl")
    assert first == {
        "prompt": "who wrote hamlet",
        "label": {"target": ["William Shakespeare", "Shakespeare"]},
        "metadata": {"env": "search", "data_source": "nq", "hop": "single", "split": "train", "id": "train_0"},
    }
    assert second["metadata"]["hop"] == "multi"


async def test_prepared_records_score_through_the_env(tmp_path):
    pq.write_table(
        pa.table({"question": ["q"], "golden_answers": [["Paris"]], "data_source": ["nq"]}), tmp_path / "a.parquet"
    )
    main(["--input", str(tmp_path / "a.parquet"), "--output", str(tmp_path / "out.jsonl")])
    [record] = _records(tmp_path / "out.jsonl")
    episode = await SearchEnvironment({}).start(Task(prompt=record["prompt"], label=record["label"]))
    await episode.step("<answer>paris</answer>")
    assert (await episode.score()).reward == 1.0


def test_search_r1_chat_prompt_and_reward_model_fallbacks(tmp_path):
    row = {
        "prompt": [{"role": "user", "content": "Answer the given question. ... Question: who is x?\n"}],
        "reward_model": {"ground_truth": {"target": ["X"]}, "style": "rule"},
        "data_source": "bamboogle",
    }
    (tmp_path / "in.jsonl").write_text(json.dumps(row) + "\n")
    main(["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")])
    [record] = _records(tmp_path / "out.jsonl")
    assert record["prompt"] == "who is x?" and record["label"] == {"target": ["X"]}
    assert record["metadata"]["hop"] == "multi"


def test_hop_tags():
    assert [hop_of(s) for s in ("nq", "TriviaQA", "popqa")] == ["single"] * 3
    assert [hop_of(s) for s in ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle")] == ["multi"] * 4
    assert hop_of("mine") is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question": "q"}\n', "in.jsonl: record 1: record has no gold answers"),
        ('{"golden_answers": ["a"]}\n{x\n', "in.jsonl: record 1: record has no question"),
    ],
)
def test_bad_input_is_named_and_leaves_no_output(tmp_path, capsys, content, message):
    (tmp_path / "in.jsonl").write_text(content)
    assert main(["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists() and not list(tmp_path.glob("*.tmp"))


def test_bad_json_line_is_numbered(tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text('{"question": "q", "golden_answers": ["a"]}\n{x\n')
    assert main(["--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")]) == 2
    assert "in.jsonl:2: not JSON" in capsys.readouterr().err


def test_demo_set_is_written_and_seeded(tmp_path, capsys):
    assert main(["--demo", str(tmp_path / "a"), "--demo-passages", "120"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["passages"] == 120 and summary["train"] == 80 and summary["test"] == 20
    main(["--demo", str(tmp_path / "b"), "--demo-passages", "120"])
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() == (tmp_path / "b" / "corpus.jsonl").read_bytes()
    train = _records(tmp_path / "a" / "train.jsonl")
    assert {r["metadata"]["hop"] for r in train} == {"single", "multi"}
    assert all(r["metadata"]["env"] == "search" and r["label"]["target"] for r in train)
