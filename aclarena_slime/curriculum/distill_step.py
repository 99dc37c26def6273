"""A stage's training data made from earlier rollout-only stages' dumps, inside a curriculum.

The chain before a warm start (and before the SDFT backbone) is: a rollout-only stage dumps its samples
(``--save-debug-rollout-data``, e.g. ``recipes/teacher_search.yaml``), ``aclarena distill sdft-data`` keeps
the good ones, and an SFT stage trains on what was kept. A curriculum stage with a ``distill`` section
runs the middle step itself, just before the stage::

    - {name: teacher_search, recipe: ../teacher_search.yaml, start: recipe}
    - name: oracle_search_sft
      recipe: ../oracle_search_sft.yaml
      start: recipe
      distill: {dumps: {search: teacher_search}}   # the filter: the recipe's custom.aclarena_sft_filter

Thresholds, statuses and the token cap come from the section, else from the stage recipe's own
``custom.aclarena_sft_filter`` (the warm starts carry the authors' filters there). The mixture is written
to ``<output_dir>/data/<stage>.jsonl`` and the stage's ``data.prompt_data`` points at it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aclarena_slime.recipes.schema import StageRecipe

DUMP_FLAG = "save_debug_rollout_data"  # the recipe's extra key naming slime's dump file template


@dataclass
class DistillStep:
    """The ``distill`` section of a curriculum stage (see the module docstring)."""

    dumps: dict[str, str] = field(default_factory=dict)  # domain -> the earlier stage whose dumps it reads
    thresholds: dict[str, float] = field(default_factory=dict)  # per domain: keep rewards >= this
    threshold: float | None = None  # domains without their own (None: the recipe's filter's min_reward)
    statuses: list[str] | None = None  # None: the recipe's filter's, else completed only
    max_tokens: int | None = None
    max_per_prompt: int | None = None

    def __post_init__(self) -> None:
        if not self.dumps:
            raise ValueError("distill.dumps must name at least one earlier stage (domain: stage)")
        unknown = set(self.thresholds) - set(self.dumps)
        if unknown:
            raise ValueError(f"distill.thresholds names domains without dumps: {sorted(unknown)}")


def data_path(output_dir: str | Path, stage: str) -> Path:
    return Path(output_dir) / "data" / f"{stage}.jsonl"


def distill_overrides(output_dir: str | Path, stage: str, step: DistillStep | None) -> list[str]:
    """The stage's data override: it trains on the mixture this step writes."""
    return [] if step is None else [f"data.prompt_data={data_path(output_dir, stage)}"]


def dump_dir(recipe: StageRecipe) -> str | None:
    """Where a rollout-only recipe's slime dumps land (the folder of its dump file template), else None."""
    template = recipe.extra.get(DUMP_FLAG)
    return str(Path(str(template)).parent) if template else None


def make_stage_data(
    step: DistillStep, recipe: StageRecipe, stages: dict[str, dict[str, Any]], out: Path
) -> dict[str, Any]:
    """Write the stage's mixture from the named stages' dumps; returns what the manifest records.

    ``stages`` are the manifest's entries; each named stage must be done and have recorded its dumps.
    Raises ValueError when a source is missing or nothing passes the filter.
    """
    from aclarena_slime.distill.dumps import dump_files, read_dump
    from aclarena_slime.distill.sdft import MixtureSettings, build_mixture, write_mixture

    sources = []
    for domain, stage in step.dumps.items():
        entry = stages.get(stage) or {}
        if entry.get("status") != "done" or not entry.get("dumps"):
            raise ValueError(f"distill: stage {stage!r} ({domain}) has not finished with rollout dumps")
        sources += [(domain, path) for path in dump_files([entry["dumps"]])]
    own = recipe.custom.aclarena_sft_filter
    base = own.mixture() if own else MixtureSettings()  # the step's own settings win over the recipe's filter
    settings = MixtureSettings(
        thresholds=dict(step.thresholds),
        default_threshold=step.threshold if step.threshold is not None else base.default_threshold,
        max_per_prompt=step.max_per_prompt,
        statuses=tuple(step.statuses or base.statuses),
        max_tokens=step.max_tokens if step.max_tokens is not None else base.max_tokens,
    )
    episodes = (episode for domain, path in sources for episode in read_dump(path, domain))
    records, report = build_mixture(episodes, settings)
    if not records:
        raise ValueError(f"distill: no trajectory passed the filter for {recipe.name} ({report.to_dict()})")
    written = write_mixture(records, out, overwrite=True)
    print(f"[curriculum] {recipe.name}: {len(records)} records from {len(sources)} dump files -> {written}",
          file=sys.stderr)  # fmt: skip
    return {"path": str(written), "records": len(records), "domains": report.to_dict()}
