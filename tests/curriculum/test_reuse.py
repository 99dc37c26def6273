"""Stage reuse between curricula: an identical finished stage (same start, settings, seed) is taken, not rerun;
a stage that differs in any of them runs."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from aclarena_slime.curriculum.runner import run_curriculum
from aclarena_slime.launcher.stage import StageResult

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


class Runner:
    """Stands in for a training backend (a GPU one): 'trains' by writing its checkpoint folder, once."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, str]] = []

    def __call__(self, recipe) -> StageResult:
        self.ran.append((recipe.name, recipe.checkpoint.load))
        save = Path(recipe.checkpoint.save)
        save.mkdir(parents=True)  # fails if a stage were run twice into one folder
        adapter = None
        if recipe.lora.enabled:
            adapter = str(save / "adapter")
            Path(adapter).mkdir()
            (Path(adapter) / "adapter_model.safetensors").write_bytes(b"weights")
        return StageResult(0, "fake", checkpoint=str(save), adapter=adapter, metrics={"reward": 0.5})


def evaluate(stage: str, entry: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"domains": {"math": 0.5}, "stage": stage}))
    return out / "summary.json"


def curriculum(tmp_path: Path, name: str, stages: list[dict], reuse: bool = True) -> Path:
    path = tmp_path / f"{name}.yaml"
    data = {"name": name, "output_dir": str(tmp_path / name), "overrides": [f"paths.root={tmp_path}"],
            "stages": stages, **({"reuse": str(tmp_path / "stages")} if reuse else {})}  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    return path


def stage(name: str, recipe: str, *overrides: str, **extra) -> dict:
    return {"name": name, "recipe": str(RECIPES / recipe), "overrides": list(overrides), **extra}


def test_an_identical_stage_is_reused_and_a_different_one_runs(tmp_path):
    runner = Runner()
    run_curriculum(curriculum(tmp_path, "chain", [stage("math", "stage1_math.yaml"),
                                                   stage("search", "stage2_search.yaml")]),
                   runner=runner, evaluator=evaluate)  # fmt: skip
    assert [name for name, _ in runner.ran] == ["math", "search"]
    chain_math = str(tmp_path / "chain" / "runs" / "math" / "checkpoint")

    # The same first stage in another curriculum (the oracle of the chain's first domain): not run again; the
    # next stage starts from the reused one's weights; a different second stage (another lr) runs.
    runner.ran.clear()
    other = curriculum(tmp_path, "other", [stage("math", "stage1_math.yaml"),
                                           stage("search", "stage2_search.yaml", "algorithm.lr=1e-7")])  # fmt: skip
    manifest = run_curriculum(other, runner=runner, evaluator=evaluate)
    assert runner.ran == [("search", chain_math)]
    math = manifest.stage("math")
    assert math["reused_from"] == "chain:math" and math["checkpoint"] == chain_math
    assert Path(math["eval"]["summary"]).is_file()  # its evaluation comes with it

    # Any difference in the stage's own settings, or in the weights it starts from, and it runs.
    runner.ran.clear()
    run_curriculum(curriculum(tmp_path, "lr", [stage("math", "stage1_math.yaml", "algorithm.lr=1e-7"),
                                               stage("search", "stage2_search.yaml")]),
                   runner=runner, evaluator=evaluate)  # fmt: skip
    assert [name for name, _ in runner.ran] == ["math", "search"]  # search: same settings, other start

    # Without a reuse folder every stage runs.
    runner.ran.clear()
    run_curriculum(curriculum(tmp_path, "alone", [stage("math", "stage1_math.yaml")], reuse=False), runner=runner,
                   evaluator=evaluate)  # fmt: skip
    assert [name for name, _ in runner.ran] == ["math"]


def test_a_reused_expert_is_served_from_the_curriculums_own_folder(tmp_path):
    runner = Runner()
    expert = [stage("math", "stage1_math.yaml", "lora.enabled=true", expert="math", start="recipe")]
    run_curriculum(curriculum(tmp_path, "first", expert), runner=runner, evaluator=evaluate)
    manifest = run_curriculum(curriculum(tmp_path, "second", expert), runner=runner, evaluator=evaluate)
    assert len(runner.ran) == 1
    table = json.loads((tmp_path / "second" / "experts.json").read_text())
    adapter = tmp_path / "second" / table["experts"]["math"]["path"]
    assert (adapter / "adapter_model.safetensors").read_bytes() == b"weights"
    assert manifest.stage("math")["reused_from"] == "first:math"
