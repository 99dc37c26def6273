"""recipes/mle_parallel.yaml: the four MLE experts in one slime job, compiled and flag-checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from aclarena_slime.lora.config import LoraConfig
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.recipes.flags import known_flags

REPO = Path(__file__).resolve().parents[2]
BALANCED = "aclarena_slime.slime_edge.data_source.BalancedDataSource"


def _compiled(tmp_path: Path, *overrides: str):
    recipe = load_recipe(REPO / "recipes" / "mle_parallel.yaml", [f"paths.root={tmp_path}", *overrides])
    return recipe, compile_recipe(recipe)


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_one_job_trains_one_expert_per_tag_on_the_paper_cluster(tmp_path: Path):
    recipe, command = _compiled(tmp_path)
    argv = command.train_args
    assert all(a in known_flags() for a in argv if a.startswith("--") and not a.startswith("--sglang-"))
    assert (_value(argv, "--actor-num-nodes"), _value(argv, "--actor-num-gpus-per-node")) == ("2", "8")
    assert _value(argv, "--data-source-path") == BALANCED
    assert _value(argv, "--custom-model-provider-path") == "aclarena_slime.slime_edge.lora.model_provider"
    assert "--sequence-parallel" not in argv and "--allgather-cp" not in argv
    lora = LoraConfig.from_mapping(command.custom_config["aclarena_lora"])
    assert lora.experts == ["math", "search", "retail", "ifeval"] and lora.num_adapters == 4
    assert command.custom_config["aclarena_experts"] == {tag: tag for tag in lora.experts}
    assert set(command.custom_config["aclarena_env_config"]) == set(lora.experts)
    # The backbone the sequential experts train on (mle_*.yaml): the same SDFT iteration and its export.
    assert _value(argv, "--load") == str(tmp_path / "runs" / "sdft_backbone" / "checkpoint")
    assert _value(argv, "--hf-checkpoint").endswith(f"hf_iter_{_value(argv, '--ckpt-step')}")


def test_parallel_experts_are_refused_without_their_envs_or_balance(tmp_path: Path):
    with pytest.raises(RecipeError, match="env_config"):
        _compiled(tmp_path, "lora.experts=[math,coding]")
    with pytest.raises(RecipeError, match="data_source_path"):
        _compiled(tmp_path, "plugins.data_source_path=aclarena_slime.slime_edge.data_source.ResumableDataSource")
    with pytest.raises(RecipeError, match="max_loras_per_batch"):
        _compiled(tmp_path, "+cluster.sglang.max_loras_per_batch=4")


@pytest.mark.slow
def test_the_recipe_runs_its_experts_side_by_side_on_the_local_backend(tmp_path: Path, capsys):
    """Two steps of two experts (math, IF) on the tiny model: one PEFT folder per expert and experts.json."""
    import json

    from aclarena_slime.experts import ExpertTable
    from aclarena_slime.launcher.stage import main

    small = ["rollout.num_rollout=2", "rollout.rollout_batch_size=1", "rollout.n_samples_per_prompt=2",
             "cluster.local.eval_size=1", "rollout.rollout_max_response_len=24", "cluster.local.warm_start_steps=0",
             "lora.experts=[math,ifeval]"]  # fmt: skip
    recipe = REPO / "recipes" / "mle_parallel.yaml"
    assert main([str(recipe), "cluster=local", f"paths.root={tmp_path}", *small]) == 0, capsys.readouterr().err
    out = tmp_path / "runs" / "mle_parallel" / "local"
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["experts"]) == {"math", "ifeval"}
    assert all(len(e["steps"]) == 2 and e["eval_after"]["prompts"] == 1 for e in metrics["experts"].values())
    table = ExpertTable.load(out / "experts.json")
    assert {t: e.adapter for t, e in table.experts.items()} == {"math": "math", "ifeval": "ifeval"}
    assert all((e.path / "adapter_config.json").is_file() for e in table.experts.values())
