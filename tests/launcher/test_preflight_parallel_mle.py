"""``aclarena doctor`` on the parallel-MLE recipe: its experts, its balanced source, its mixed data."""

from __future__ import annotations

import json
from pathlib import Path

from aclarena_slime.launcher import preflight
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import load_recipe

REPO = Path(__file__).resolve().parents[2]


def _load(tmp_path: Path, *overrides: str):
    return load_recipe(REPO / "recipes" / "mle_parallel.yaml", [f"paths.root={tmp_path}", *overrides])


def _mixed_data(recipe, tags: list[str]) -> None:
    from aclarena_slime.plugin.registry import load_factory

    path = Path(recipe.data.prompt_data)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [r for tag in tags for r in load_factory(tag)({}).demo_records(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_doctor_knows_the_parallel_experts(tmp_path: Path, routable):
    recipe = _load(tmp_path, "lora.experts=[math,ifeval]")
    argv = compile_recipe(recipe).train_args
    _mixed_data(recipe, ["math", "ifeval"])
    checks = {c.name: c.status for c in preflight.check_lora(recipe, argv)}
    assert checks["lora experts"] == checks["lora experts data source"] == checks["lora experts in the data"] == "ok"
    data = {c.name: c.status for c in preflight.check_data(recipe)}
    assert data["data through env.start"] == "ok"  # each record goes through its own env
    _mixed_data(recipe, ["math"])
    checks = {c.name: c for c in preflight.check_lora(recipe, [*argv, "--allgather-cp"])}
    assert checks["lora experts in the data"].status == "fail" and "ifeval" in checks["lora experts in the data"].detail
    assert checks["lora experts context parallel"].status == "fail"
