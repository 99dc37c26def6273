"""Faults of a curriculum run: a crash between a stage's end and its expert, an expert outside the run folder,
an evaluation cut short, two runs into one folder, a curriculum killed while its evaluation runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aclarena_slime.curriculum import runner as curriculum_runner
from aclarena_slime.curriculum.manifest import DONE, MANIFEST_NAME, Manifest
from aclarena_slime.curriculum.runner import CurriculumFailed, run_curriculum
from tests.curriculum.test_curriculum import RECIPES, FakeRunner, write_curriculum

MLE = [
    f"{{name: backbone, recipe: {RECIPES}/sdft_backbone.yaml}}",
    f"{{name: e_math, recipe: {RECIPES}/mle_math.yaml, start: backbone, expert: math}}",
]


def _experts(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "experts.json").read_text())["experts"]


@pytest.mark.slow
def test_a_done_stage_whose_expert_was_never_registered_is_repaired_not_skipped(tmp_path: Path):
    """The state a crash right after ``status=done`` left: the stage done, its expert nowhere. Evaluated as it
    was, the expert's column would be the base model's."""
    path = write_curriculum(tmp_path, "mle", MLE)
    run_curriculum(path, runner=FakeRunner(), evaluator=lambda *_: None)
    manifest = tmp_path / "out" / MANIFEST_NAME
    data = json.loads(manifest.read_text())
    data["experts"] = {}
    del data["stages"][1]["eval_note"]
    manifest.write_text(json.dumps(data))
    (tmp_path / "out" / "experts.json").unlink()

    again, seen = FakeRunner(), []
    run_curriculum(path, runner=again, evaluator=lambda stage, entry, out: seen.append((stage, entry["experts"])))
    assert again.calls == []  # nothing trained again
    assert _experts(tmp_path)["math"] == {"adapter": "math", "path": "runs/e_math/checkpoint/adapter", "stage": "e_math"}
    assert seen == [("e_math", str(tmp_path / "out" / "experts.json"))]  # evaluated with its expert


@pytest.mark.slow
def test_a_crash_while_the_expert_is_written_loses_nothing(tmp_path: Path, monkeypatch):
    path = write_curriculum(tmp_path, "mle", MLE)
    real = Manifest.write_experts

    def crash(self):
        raise KeyboardInterrupt("killed while writing experts.json")

    monkeypatch.setattr(Manifest, "write_experts", crash)
    with pytest.raises(KeyboardInterrupt):
        run_curriculum(path, runner=FakeRunner(), evaluator=lambda *_: None)
    monkeypatch.setattr(Manifest, "write_experts", real)
    again = FakeRunner()
    run_curriculum(path, runner=again, evaluator=lambda *_: None)
    assert again.calls == [] and _experts(tmp_path)["math"]["stage"] == "e_math"


def test_a_stage_without_its_adapter_is_failed_not_done(tmp_path: Path):
    class NoAdapter(FakeRunner):
        def __call__(self, recipe):
            result = super().__call__(recipe)
            result.adapter = None
            return result

    with pytest.raises(CurriculumFailed, match="produced no adapter"):
        run_curriculum(write_curriculum(tmp_path, "mle", MLE), runner=NoAdapter(), evaluator=lambda *_: None)
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert [s["status"] for s in data["stages"]] == [DONE, "failed"]


def test_an_expert_outside_the_output_dir_is_refused_before_anything_trains(tmp_path: Path):
    stages = [MLE[0], MLE[1].replace("expert: math}", f"expert: math, overrides: ['paths.runs={tmp_path}/shared']}}")]
    runner = FakeRunner()
    with pytest.raises(CurriculumFailed, match="e_math would write its expert's adapter .* outside"):
        run_curriculum(write_curriculum(tmp_path, "mle", stages), runner=runner, evaluator=lambda *_: None)
    assert runner.calls == []


def test_on_slime_a_sync_dir_outside_the_output_dir_is_refused_up_front(tmp_path: Path, monkeypatch):
    """The docs ask for lora.sync_dir on a shared filesystem: outside output_dir, experts.json cannot name it."""
    from aclarena_slime.launcher.backend import BackendChoice

    monkeypatch.setattr(curriculum_runner, "choose_backend", lambda _: BackendChoice("slime", "test"))
    stages = [MLE[0], MLE[1].replace("expert: math}", "expert: math, overrides: [lora.sync_dir=/shared/adapters]}")]
    runner = FakeRunner()
    with pytest.raises(CurriculumFailed, match="/shared/adapters/math"):
        run_curriculum(write_curriculum(tmp_path, "mle", stages), runner=runner, evaluator=lambda *_: None,
                       head=lambda _: pytest.fail("no head before the check"))  # fmt: skip
    assert runner.calls == []


def test_a_second_run_into_the_same_folders_is_refused_naming_the_first(tmp_path: Path):
    path = write_curriculum(tmp_path, "mle", MLE[:1])
    second: list[BaseException] = []

    class StartsASecondRun(FakeRunner):
        def __call__(self, recipe):
            try:
                run_curriculum(path, runner=FakeRunner(), evaluator=lambda *_: None)
            except BaseException as exc:  # noqa: BLE001 - what the second run says
                second.append(exc)
            return super().__call__(recipe)

    run_curriculum(path, runner=StartsASecondRun(), evaluator=lambda *_: None)
    assert len(second) == 1 and isinstance(second[0], CurriculumFailed)
    assert f"pid {os.getpid()}" in str(second[0]) and "in use by another run" in str(second[0])
    assert run_curriculum(path, runner=FakeRunner(), evaluator=lambda *_: None).is_done("backbone")  # released


EVAL = """
import json, pathlib, sys
out = pathlib.Path(sys.argv[1]); samples = out / "samples"
(out / "argv.txt").open("a").write(" ".join(sys.argv[2:]) + "\\n")
if (samples / "d.jsonl").exists() and "--resume" not in sys.argv:
    sys.exit("ResultsExist: already holds results; resume them or choose another output folder")
samples.mkdir(parents=True, exist_ok=True)
with (samples / "d.jsonl").open("a") as f:
    f.write("{}\\n")
if len((samples / "d.jsonl").read_text().splitlines()) == 1:
    sys.exit("killed mid-evaluation")
(out / "summary.json").write_text(json.dumps({"ok": True}))
"""


def test_an_evaluation_cut_short_resumes_on_the_rerun(tmp_path: Path):
    script = tmp_path / "eval.py"
    script.write_text(EVAL)
    path = write_curriculum(tmp_path, "mle", MLE[:1], evaluation=[sys.executable, str(script), "{out}"])
    with pytest.raises(CurriculumFailed, match="evaluation of backbone failed"):
        run_curriculum(path, runner=FakeRunner())
    run_curriculum(path, runner=FakeRunner())
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert data["stages"][0]["eval"] == {"summary": "eval/backbone/summary.json"}
    assert (tmp_path / "out" / "eval" / "backbone" / "argv.txt").read_text().splitlines() == ["", "--resume"]


EVAL_WITH_ENGINE = """
import os, pathlib, subprocess, sys, time
engine = subprocess.Popen(["sleep", "60"])
pathlib.Path(sys.argv[1], "pids").write_text(f"{os.getpid()} {engine.pid}")
time.sleep(60)
"""
CURRICULUM = """
import sys
from pathlib import Path
from aclarena_slime.curriculum.runner import command_evaluator, exit_on_signals
exit_on_signals()
command_evaluator([sys.executable, sys.argv[2], "{out}"])("s1", {}, Path(sys.argv[1]))
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_dead(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_curriculum_that_dies_takes_its_evaluation_with_it(tmp_path: Path, how):
    out = tmp_path / "eval"
    out.mkdir()
    script, evaluation = tmp_path / "curriculum.py", tmp_path / "evaluation.py"
    script.write_text(CURRICULUM)
    evaluation.write_text(EVAL_WITH_ENGINE)
    parent = subprocess.Popen([sys.executable, str(script), str(out), str(evaluation)])
    pids = out / "pids"
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text()) and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.05)
    child, grandchild = (int(p) for p in pids.read_text().split())
    try:
        parent.send_signal(how)
        parent.wait(timeout=30)
        assert _wait_dead(child), "the evaluation outlived the curriculum"
        if how == signal.SIGTERM:  # its process group: the engine it started goes too
            assert _wait_dead(grandchild), "the evaluation's engine outlived the curriculum"
    finally:
        for pid in (child, grandchild):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
