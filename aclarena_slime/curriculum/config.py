"""The curriculum file: which stage recipes run, in what order, and what each starts from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aclarena_slime.curriculum.distill_step import DistillStep
from aclarena_slime.distill.balanced_source import ReplaySettings
from aclarena_slime.evaluation.monitor import MonitorError, MonitorSettings
from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.recipes.domains import StagesFrom, plan_stages

STARTS = ("previous", "recipe")  # "previous": the stage before's output; "recipe": whatever the recipe says


@dataclass
class StageEntry:
    name: str = MISSING  # unique within the curriculum (the manifest's key)
    recipe: str = MISSING  # a recipe file, relative to the curriculum file's folder or absolute
    start: str = "previous"  # previous | recipe | the name of an earlier stage
    expert: str | None = None  # env tag this stage's adapter serves (MLE experts)
    overrides: list[str] = field(default_factory=list)
    distill: DistillStep | None = None  # train on a mixture of earlier stages' rollout dumps (distill_step.py)


@dataclass
class EvaluationConfig:
    """The forgetting-matrix step: a command run after every stage (empty: the step is recorded as skipped).

    Placeholders: ``{python}`` (this interpreter), ``{stage}``, ``{checkpoint}``, ``{model}`` (the checkpoint,
    or the local backend's base model), ``{adapter}``, ``{experts}``, ``{out}`` (the folder for
    this stage's results; its ``summary.json`` goes into the manifest, as ``aclarena eval matrix`` reads it).
    These are filled when the stage has run (its outputs exist only then), as a service's ``{host}`` /
    ``{port}`` are when it starts; anything known when the file is read is OmegaConf interpolation.
    """

    command: list[str] = field(default_factory=list)


@dataclass
class KlAnchorSettings:
    """The KL-anchor baseline: stage k's KL reference is the policy that ended stage k-1 (its checkpoint,
    slime's ``--ref-load``), not the base model, with its own coefficient. Stage 1 keeps its recipe's reference.
    On the local backend the reference is the policy the stage starts from: the previous stage's."""

    enabled: bool = False
    coef: float = 0.1  # --kl-loss-coef (the authors' scripts use 0.01 for math/search, 0.1 for retail)
    loss_type: str = "low_var_kl"  # --kl-loss-type

    def __post_init__(self) -> None:
        if self.coef <= 0:
            raise ValueError(f"kl_anchor.coef must be positive, got {self.coef!r}")


@dataclass
class CurriculumConfig:
    name: str = MISSING
    output_dir: str = MISSING
    overrides: list[str] = field(default_factory=list)  # applied to every stage (e.g. paths.root=..., cluster=...)
    base: str | None = None  # name of the base model row (for FWT), informational
    stages: list[StageEntry] = field(default_factory=list)
    stages_from: StagesFrom | None = None  # the stages made from a domain list instead (recipes/domains.py)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    monitor: MonitorSettings = field(default_factory=MonitorSettings)  # forgetting checks inside each stage
    replay: ReplaySettings = field(default_factory=ReplaySettings)  # the replay baseline's data mixture
    kl_anchor: KlAnchorSettings = field(default_factory=KlAnchorSettings)  # the KL-anchor baseline
    # A folder of finished stages shared with other curricula: a stage whose fingerprint is recorded there is
    # taken from it, not run again (curriculum/reuse.py). None: every stage runs.
    reuse: str | None = None


def load_curriculum(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> CurriculumConfig:
    """Read and check a curriculum YAML; ``overrides`` are dotted ``key=value`` pairs on the file."""
    path = Path(path)
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(CurriculumConfig), OmegaConf.load(path), OmegaConf.from_dotlist(list(overrides))
        )
        OmegaConf.resolve(merged)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise RecipeError(f"{path}: required settings have no value: {', '.join(missing)}")
        config: CurriculumConfig = OmegaConf.to_object(merged)
    except (OSError, OmegaConfBaseException) as exc:
        raise RecipeError(f"{path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    except (MonitorError, ValueError) as exc:
        raise RecipeError(f"{path}: {exc}") from exc
    if config.stages_from is not None:
        if config.stages:
            raise RecipeError(f"{path}: give stages or stages_from, not both")
        try:
            config.stages = [stage_entry(s) for s in plan_stages(config.stages_from, path.resolve().parent)]
        except (TypeError, ValueError) as exc:  # a plan's entry the schema refuses (DistillStep's checks)
            raise RecipeError(f"{path}: stages_from: {exc}") from exc
    check(config, str(path))
    if config.monitor.suite:  # relative to the curriculum file, like the stage recipes
        config.monitor.suite = str((path.resolve().parent / config.monitor.suite).resolve())
    return config


def stage_entry(made: dict[str, Any]) -> StageEntry:
    """A plan's stage entry as the file would give it (its overrides kept verbatim: Hydra resolves them)."""
    distill = made.get("distill")
    return StageEntry(**{**made, "distill": DistillStep(**distill) if distill is not None else None})


def check(config: CurriculumConfig, source: str) -> None:
    if not config.stages:
        raise RecipeError(f"{source}: a curriculum needs at least one stage")
    seen: set[str] = set()
    for number, stage in enumerate(config.stages, 1):
        if stage.name in seen:
            raise RecipeError(f"{source}: stage {number} repeats the name {stage.name!r}")
        if stage.start not in STARTS and stage.start not in seen:
            raise RecipeError(
                f"{source}: stage {stage.name!r} starts from {stage.start!r}, which is neither "
                f"{' nor '.join(STARTS)} nor an earlier stage"
            )
        unseen = set(stage.distill.dumps.values()) - seen if stage.distill is not None else set()
        if unseen:
            raise RecipeError(
                f"{source}: stage {stage.name!r} distills the dumps of {sorted(unseen)}: not earlier stages"
            )
        if stage.start == "previous" and number == 1:
            stage.start = "recipe"  # the first stage starts where its recipe says
        seen.add(stage.name)


def recipe_path(curriculum_file: Path, entry: StageEntry) -> Path:
    path = Path(entry.recipe)
    return path if path.is_absolute() else (curriculum_file.resolve().parent / path).resolve()
