"""Rollout dumps -> ``aclarena distill sdft-data`` -> the warm start, chained inside a curriculum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aclarena_slime.curriculum.config import load_curriculum
from aclarena_slime.curriculum.runner import CurriculumFailed, run_curriculum
from aclarena_slime.launcher.stage import StageResult
from aclarena_slime.recipes.compose import RecipeError

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def episode(reward: float, status: str, question: str) -> dict:
    """One dumped sample as our rollout leaves it (JSONL with messages, as ``sdft-data`` reads)."""
    messages = [
        {"role": "user", "content": question},
        {"role": "assistant", "content": f"<answer> {question} </answer>"},
    ]
    return {"messages": messages, "reward": reward, "status": status, "metadata": {"env": "search"}}


class DumpingRunner:
    """Stands in for slime: a rollout-only stage writes dump files where its recipe says; others record data."""

    def __init__(self) -> None:
        self.trained_on: dict[str, str] = {}

    def __call__(self, recipe) -> StageResult:
        template = recipe.extra.get("save_debug_rollout_data")
        if template:
            dumps = Path(template).parent
            dumps.mkdir(parents=True)
            rows = [episode(1.0, "completed", "q1"), episode(0.5, "truncated", "q2"), episode(0.1, "completed", "q3")]
            (dumps / "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            return StageResult(0, "fake")
        self.trained_on[recipe.name] = recipe.data.prompt_data
        Path(recipe.checkpoint.save).mkdir(parents=True)
        return StageResult(0, "fake", checkpoint=recipe.checkpoint.save)


def write(tmp_path: Path, stages: list[str]) -> Path:
    path = tmp_path / "chain.yaml"
    lines = ["name: chain", f"output_dir: {tmp_path / 'out'}", f"overrides: ['paths.root={tmp_path}']", "stages:"]
    path.write_text("\n".join(lines + [f"  - {s}" for s in stages]) + "\n")
    return path


def test_teacher_dumps_become_the_warm_starts_data(tmp_path):
    file = write(tmp_path, [
        f"{{name: teacher_search, recipe: {RECIPES}/teacher_search.yaml, start: recipe}}",
        f"{{name: oracle_search_sft, recipe: {RECIPES}/oracle_search_sft.yaml, start: recipe,"
        " distill: {dumps: {search: teacher_search}}}",
    ])  # fmt: skip
    runner = DumpingRunner()
    manifest = run_curriculum(file, runner=runner)
    data = tmp_path / "out" / "data" / "oracle_search_sft.jsonl"
    assert runner.trained_on == {"oracle_search_sft": str(data)}
    kept = [json.loads(line) for line in data.read_text().splitlines()]
    # the recipe's own filter (the authors' SeaSFT one): reward >= 0.4, completed or truncated
    assert sorted(r["messages"][0]["content"] for r in kept) == ["q1", "q2"]
    assert manifest.stage("oracle_search_sft")["data"]["records"] == 2
    assert manifest.stage("teacher_search")["dumps"].endswith("teacher_search/dump/rollout_data")


def test_a_distill_threshold_overrides_the_recipes_filter(tmp_path):
    file = write(tmp_path, [
        f"{{name: teacher_search, recipe: {RECIPES}/teacher_search.yaml, start: recipe}}",
        f"{{name: oracle_search_sft, recipe: {RECIPES}/oracle_search_sft.yaml, start: recipe,"
        " distill: {dumps: {search: teacher_search}, threshold: 1.0, statuses: [completed]}}",
    ])  # fmt: skip
    run_curriculum(file, runner=DumpingRunner())
    data = tmp_path / "out" / "data" / "oracle_search_sft.jsonl"
    assert [json.loads(line)["messages"][0]["content"] for line in data.read_text().splitlines()] == ["q1"]


def test_nothing_kept_fails_the_stage_before_it_runs(tmp_path):
    file = write(tmp_path, [
        f"{{name: teacher_search, recipe: {RECIPES}/teacher_search.yaml, start: recipe}}",
        f"{{name: oracle_search_sft, recipe: {RECIPES}/oracle_search_sft.yaml, start: recipe,"
        " distill: {dumps: {search: teacher_search}, threshold: 2.0}}",
    ])  # fmt: skip
    runner = DumpingRunner()
    with pytest.raises(CurriculumFailed, match="no trajectory passed the filter"):
        run_curriculum(file, runner=runner)
    assert runner.trained_on == {}


def test_distilling_a_later_stage_is_refused(tmp_path):
    file = write(tmp_path, [
        f"{{name: oracle_search_sft, recipe: {RECIPES}/oracle_search_sft.yaml, start: recipe,"
        " distill: {dumps: {search: teacher_search}}}",
        f"{{name: teacher_search, recipe: {RECIPES}/teacher_search.yaml, start: recipe}}",
    ])  # fmt: skip
    with pytest.raises(RecipeError, match="not earlier stages"):
        load_curriculum(file)


@pytest.mark.parametrize("name", ["warm_starts.yaml", "sdft_data.yaml"])
def test_the_shipped_chains_load(name):
    config = load_curriculum(RECIPES / "curriculum" / name)
    assert any(stage.distill for stage in config.stages)
