"""Run a curriculum: stages in order, each started from its source's output, with resume and evaluation.

The stage runner and the evaluator are parameters (a test passes fakes); by default a stage runs through
the same code as ``launch/stage.sh`` and evaluation runs the curriculum's ``evaluation.command``.
A stage marked done in the manifest is never run again; a stage that was running when the process died
is run again from its start.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aclarena_slime.curriculum.config import CurriculumConfig, StageEntry, load_curriculum, recipe_path
from aclarena_slime.curriculum.manifest import DONE, EXPERTS_NAME, FAILED, RUNNING, Manifest
from aclarena_slime.launcher.stage import StageResult, normalise_overrides
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.recipes.flags import UnknownFlagError
from aclarena_slime.recipes.schema import StageRecipe

StageRunner = Callable[[StageRecipe], StageResult]
# (stage name, its manifest entry, results folder) -> path of summary.json, or None when not evaluated
Evaluator = Callable[[str, dict[str, Any], Path], "Path | None"]


class CurriculumFailed(RuntimeError):
    pass


def default_stage_runner(recipe: StageRecipe) -> StageResult:
    from aclarena_slime.launcher.backend import choose_backend
    from aclarena_slime.launcher.stage import run_recipe

    choice = choose_backend(recipe.cluster.backend)
    print(f"[curriculum] {recipe.name}: backend {choice.name} ({choice.reason})", file=sys.stderr)
    return run_recipe(recipe, choice)


def command_evaluator(command: list[str]) -> Evaluator:
    """Run ``command`` (placeholders filled from the stage's entry) after each stage."""

    def evaluate(stage: str, entry: dict[str, Any], out: Path) -> Path | None:
        if not command:
            return None
        out.mkdir(parents=True, exist_ok=True)
        values = {
            "python": sys.executable,
            "stage": stage,
            "checkpoint": entry.get("checkpoint") or "",
            # the model to serve: a checkpoint, or the local backend's base model (its adapter is an expert)
            "model": entry.get("checkpoint") or (entry.get("metrics") or {}).get("model_dir") or "",
            "adapter": entry.get("adapter") or "",
            "experts": entry.get("experts") or "",
            "out": str(out),
        }
        argv = [part.format(**values) for part in command]
        print(f"[curriculum] evaluating {stage}: {' '.join(argv)}", file=sys.stderr)
        if subprocess.run(argv, check=False).returncode != 0:
            raise CurriculumFailed(f"evaluation of {stage} failed: {' '.join(argv)}")
        summary = out / "summary.json"
        return summary if summary.exists() else None

    return evaluate


def lineage_overrides(source: dict[str, Any] | None) -> list[str]:
    """Hydra overrides that start a stage from ``source``'s output (a checkpoint, else an adapter)."""
    if source is None:
        return []
    if source.get("checkpoint"):
        return [f"checkpoint.load={source['checkpoint']}"]  # ref_load follows load unless a recipe says otherwise
    if source.get("adapter"):
        return [f"++cluster.local.base_adapter={source['adapter']}"]
    raise CurriculumFailed(f"stage {source['name']} left neither a checkpoint nor an adapter to start from")


def stage_recipe(config: CurriculumConfig, file: Path, entry: StageEntry, source: dict[str, Any] | None) -> StageRecipe:
    overrides = [
        f"paths.runs={Path(config.output_dir) / 'runs'}",
        *normalise_overrides(list(config.overrides)),
        *lineage_overrides(source),
        *normalise_overrides(list(entry.overrides)),
        f"name={entry.name}",
    ]
    return load_recipe(recipe_path(file, entry), overrides)


def run_curriculum(
    file: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    runner: StageRunner = default_stage_runner,
    evaluator: Evaluator | None = None,
) -> Manifest:
    """Run every stage not yet done; returns the manifest. Raises :class:`CurriculumFailed` on a failed stage."""
    file = Path(file)
    config = load_curriculum(file, overrides)
    out = Path(config.output_dir)
    evaluator = evaluator or command_evaluator(list(config.evaluation.command))
    manifest = Manifest.open(out, config.name)
    # Build every recipe first: a typo in stage 4 should fail now, not after three days of training.
    for entry in config.stages:
        stage_recipe(config, file, entry, None)
    previous: str | None = None
    for entry in config.stages:
        source_name = previous if entry.start == "previous" else (None if entry.start == "recipe" else entry.start)
        if manifest.is_done(entry.name):
            print(f"[curriculum] {entry.name}: done earlier, skipped", file=sys.stderr)
            previous = entry.name
            continue
        source = manifest.stage(source_name) if source_name else None
        if source_name and (source is None or source.get("status") != DONE):
            raise CurriculumFailed(f"stage {entry.name} starts from {source_name}, which has not finished")
        recipe = stage_recipe(config, file, entry, source)
        manifest.update_stage(
            entry.name, recipe=entry.recipe, env=recipe.data.env, start_from=source_name,
            loaded=(source or {}).get("checkpoint") or (source or {}).get("adapter") or recipe.checkpoint.load,
            status=RUNNING, started_at=time.time(),
        )  # fmt: skip
        result = runner(recipe)
        if result.status != 0:
            manifest.update_stage(entry.name, status=FAILED, exit_status=result.status, backend=result.backend)
            raise CurriculumFailed(f"stage {entry.name} failed with status {result.status}")
        record = manifest.update_stage(
            entry.name, status=DONE, backend=result.backend, checkpoint=result.checkpoint,
            adapter=result.adapter, metrics=_small(result.metrics), finished_at=time.time(),
        )  # fmt: skip
        if entry.expert:
            if not result.adapter:
                raise CurriculumFailed(f"stage {entry.name} is the {entry.expert!r} expert but produced no adapter")
            base = {"name": source_name or "base", "path": (source or {}).get("checkpoint") or ""}
            manifest.set_expert(entry.expert, _relative(result.adapter, out), entry.name, base)
        experts = str(manifest.path.with_name(EXPERTS_NAME)) if manifest.data["experts"] else ""
        summary = evaluator(entry.name, {**record, "experts": experts}, out / "eval" / entry.name)
        note = None
        if summary is None:
            note = "the evaluation wrote no summary.json" if config.evaluation.command else "no evaluation.command"
        manifest.update_stage(
            entry.name, eval={"summary": _relative(str(summary), out)} if summary else None, eval_note=note
        )
        previous = entry.name
    return manifest


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def _small(metrics: dict[str, Any]) -> dict[str, Any]:
    """Scalars only: the manifest stays readable; full metrics live in the stage's folder."""
    return {k: v for k, v in (metrics or {}).items() if isinstance(v, int | float | str | bool)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launch/curriculum.sh", description="Run a curriculum's stages in order.")
    parser.add_argument("curriculum", help="recipes/curriculum/<name>.yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of the curriculum file, e.g. output_dir=/runs/x")
    args = parser.parse_intermixed_args(argv)
    try:
        manifest = run_curriculum(args.curriculum, args.overrides)
    except (RecipeError, UnknownFlagError, CurriculumFailed, ValueError) as exc:
        print(f"curriculum.sh: {exc}", file=sys.stderr)
        return 1
    print(f"[curriculum] all stages done; manifest: {manifest.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
