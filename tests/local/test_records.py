"""A local stage's records: a label its env's ``check_label`` refuses stops the stage as its data loads, naming
``file:line`` (not when the record is drawn mid-run)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aclarena_envs.learnable.env import LearnableEnvironment
from aclarena_slime.local.records import RecordError, stage_records
from aclarena_slime.testing.local import LEARNABLE, local_session


class Checked(LearnableEnvironment):
    """The learnable env with a label check: a label must be a non-empty string of allowed characters."""

    def check_label(self, label: Any) -> None:
        if not isinstance(label, str) or not label:
            raise ValueError(f"the label must be the allowed characters, got {label!r}")


def _write(path, labels) -> None:
    path.write_text("".join(json.dumps({"prompt": f"Reply {i}", "label": label}) + "\n"
                            for i, label in enumerate(labels)))  # fmt: skip


def test_a_bad_training_label_fails_when_the_stage_loads_its_data_naming_file_and_line(tmp_path):
    data = tmp_path / "train.jsonl"
    _write(data, ["0123", 7, "01"])
    session = local_session(tmp_path, *LEARNABLE, f"++cluster.local.data_path={data}", "++cluster.local.eval_size=0")
    with pytest.raises(RecordError, match=rf"{data}:2: bad label for env 'learnable': .*got 7"):
        stage_records(Checked(), session.records)
    _write(data, ["0123x", "7x", "01x"])  # a string label ("7" alone decodes as the number 7)
    assert len(stage_records(Checked(), session.records).train) == session.loop.steps * session.loop.sampling.prompts_per_step


def test_a_bad_held_out_label_fails_too(tmp_path):
    held_out = tmp_path / "eval.jsonl"
    _write(held_out, ["01", ""])
    session = local_session(tmp_path, *LEARNABLE, f"++cluster.local.eval_data_path={held_out}")
    with pytest.raises(RecordError, match=rf"{held_out}:2: bad label"):
        stage_records(Checked(), session.records)


def test_demo_records_go_through_the_check(tmp_path):
    class Refusing(LearnableEnvironment):
        def check_label(self, label: Any) -> None:
            raise ValueError("no label passes")

    with pytest.raises(RecordError, match="demo record 0: bad label for env 'learnable': no label passes"):
        stage_records(Refusing(), local_session(tmp_path, *LEARNABLE, "++cluster.local.eval_size=2").records)
