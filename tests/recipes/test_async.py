"""The asynchronous LoRA recipe: slime's train_async.py, versioned adapters, and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.recipes.flags import known_flags

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _compile(tmp_path: Path, *overrides: str):
    return compile_recipe(load_recipe(RECIPES / "mle_retail_async.yaml", [f"paths.root={tmp_path}", *overrides]))


def test_async_recipe_runs_train_async_with_versioned_adapters(tmp_path: Path):
    command = _compile(tmp_path, "cluster=paper_2x8")
    assert command.argv()[1].endswith("/train_async.py")
    args = command.train_args
    assert "--colocate" not in args
    assert args[args.index("--rollout-num-gpus") + 1] == "8"
    assert all(flag in known_flags() for flag in args if flag.startswith("--"))  # slime's parser knows each
    # The parity check at the first train step, in slime's TIS call (the recipe applies no correction).
    assert "--use-tis" in args
    assert args[args.index("--custom-tis-function-path") + 1] == "aclarena_slime.slime_edge.parity.check_in_loss"
    # Not --get-mismatch-metrics: slime would then require and apply a TIS function, which this recipe turns off.
    assert "--get-mismatch-metrics" not in args
    lora = command.custom_config["aclarena_lora"]
    assert lora["staleness_budget"] == 1 and lora["sync_dir"]
    assert command.custom_config["aclarena_experts"]["retail"] == "retail"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.colocate=true", "cluster.rollout_num_gpus=null"], "refuses colocation"),
        (["lora.staleness_budget=null"], "needs lora.staleness_budget"),
        (["lora.staleness_budget=-1"], "staleness_budget must be None or an integer >= 0"),
    ],
)
def test_async_refusals_say_what_to_change(tmp_path: Path, overrides: list[str], message: str):
    with pytest.raises(RecipeError, match=message):
        _compile(tmp_path, *overrides)


def test_the_synchronous_recipe_still_runs_train_py(tmp_path: Path):
    command = compile_recipe(load_recipe(RECIPES / "mle_retail.yaml", [f"paths.root={tmp_path}"]))
    assert command.argv()[1].endswith("/train.py")
    assert command.custom_config["aclarena_lora"]["staleness_budget"] is None
