"""Local saves killed part-way (issue 44 §5): the next save clears the ``.staging``/``.retired`` folders they
left, and puts back a version retired by a save killed between its two renames."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aclarena_slime.local import trainer
from aclarena_slime.local.trainer import publish_folder, staging_folder


def _save(directory: Path, text: str) -> None:
    staging = staging_folder(directory)
    staging.mkdir()
    (staging / "adapter_config.json").write_text(text)
    publish_folder(staging, directory)


def test_killed_saves_leave_no_litter_after_the_next_save(tmp_path):
    directory = tmp_path / "expert"
    _save(directory, "v1")
    staging_folder(directory).mkdir()  # killed while writing its next version
    (tmp_path / ".expert.retired-0000dead").mkdir()  # killed while removing the retired version
    _save(directory, "v2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["expert"]
    assert (directory / "adapter_config.json").read_text() == "v2"


def test_a_save_killed_between_its_renames_loses_nothing(tmp_path, monkeypatch):
    directory = tmp_path / "expert"
    _save(directory, "v1")
    real_replace = os.replace

    def dies_after_the_first(src, dst):
        real_replace(src, dst)
        if ".retired-" in str(dst):
            raise KeyboardInterrupt("killed between the renames")

    monkeypatch.setattr(trainer.os, "replace", dies_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        _save(directory, "v2")
    monkeypatch.setattr(trainer.os, "replace", real_replace)
    assert not directory.exists()
    staging_folder(directory)  # the next save begins: the retired version is back first
    assert (directory / "adapter_config.json").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["expert"]
    _save(directory, "v3")
    assert (directory / "adapter_config.json").read_text() == "v3"
