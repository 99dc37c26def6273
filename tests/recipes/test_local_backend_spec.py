"""The local backend runs the recipe: its sections are the one source, the local profile sets the same keys,
the command line wins over both, and what the backend cannot run is refused or warned about by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aclarena_slime.launcher.stage import local_profile, main, normalise_overrides
from aclarena_slime.local.session import open_session
from aclarena_slime.recipes.compose import RecipeError, load_recipe

REPO = Path(__file__).resolve().parents[2]
MATH = str(REPO / "recipes/stage1_math.yaml")


def stage_sh_local(recipe: str, *overrides: str):
    """What ``launch/stage.sh RECIPE OVERRIDES`` builds on a machine where the local backend is chosen."""
    items = normalise_overrides(list(overrides))
    return open_session(load_recipe(recipe, items, local_profile(items)))


def test_command_line_overrides_reach_the_local_stage(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    session = stage_sh_local(MATH, "algorithm.lr=5e-3", "rollout.n_samples_per_prompt=2")
    sampling = session.loop.sampling
    assert (session.policy.train.lr, sampling.groups.samples) == (5e-3, 2)
    # The rest comes from the local profile (recipes/profile/local.yaml, recipes/env/local/math.yaml).
    budget = session.engine.budgets.max_response_len  # the profile's rollout_max_response_len
    assert (session.loop.steps, sampling.prompts_per_step, budget, session.model.source) == (
        16, 8, 32, "tiny"
    )  # fmt: skip
    assert session.paths.output_dir == tmp_path / "runs" / "stage1_math" / "local"


def test_dry_run_prints_the_overridden_local_settings(tmp_path: Path, capsys):
    args = [MATH, "--dry-run", f"paths.root={tmp_path}", "backend=local", "algorithm.lr=5e-3",
            "rollout.n_samples_per_prompt=2", "rollout.num_rollout=3", "rollout.rollout_batch_size=5"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "GRPO (3 steps x 5 prompts x 2 samples)" in out and "ray job submit" not in out
    plan = out[out.index("#   {") :]
    settings = json.loads("\n".join(line[4:] for line in plan.splitlines()))
    rollout = settings["rollout"]
    assert (settings["algorithm"]["lr"], rollout["n_samples_per_prompt"], rollout["num_rollout"],
            rollout["rollout_batch_size"]) == (5e-3, 2, 3, 5)  # fmt: skip


def test_recipe_sections_map_onto_the_local_stage(tmp_path: Path):
    recipe = load_recipe(
        REPO / "recipes/mle_search.yaml",
        [f"paths.root={tmp_path}", "cluster=local", "rollout.rollout_temperature=0.7", "algorithm.eps_clip_high=0.3",
         "data.eval_temperature=0.5", "data.eval_max_response_len=64", "data.n_samples_per_eval_prompt=3",
         "lora.rank=4", "lora.dropout=0.1",
         "custom.aclarena_response_budget=per_turn"],
    )  # fmt: skip
    session = open_session(recipe)
    loss, evaluation, lora = session.policy.train.loss, session.loop.evaluation, session.policy.lora
    assert (session.policy.train.rollouts.temperature, loss.clip_low, loss.clip_high) == (0.7, 0.2, 0.3)
    assert (evaluation.temperature, evaluation.max_new_tokens, evaluation.samples, session.engine.budgets.mode) == (
        0.5, 64, 3, "per_turn"
    )  # fmt: skip
    assert (lora.rank, lora.alpha, lora.dropout, session.policy.name) == (4, 32.0, 0.1, "search")
    assert lora.hf_target_modules() == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    # The env's local part: its demo turns, its budget, the demo corpus instead of the retriever service.
    assert session.warm_start.demos == "aclarena_envs.search.data.demo_turns"
    assert session.engine.budgets.max_response_len == 256
    assert session.records.env_config["retriever_url"] is None and session.records.env_config["topk"] == 1


@pytest.mark.parametrize(
    ("stage", "temperature", "top_p", "samples"),
    [("stage1_math", 1.0, 1.0, 8), ("stage2_search", 1.0, 1.0, 8), ("stage4_if", 1.0, 0.7, 8)],
)
def test_the_local_profile_evaluates_as_the_authors_do(stage: str, temperature, top_p, samples, tmp_path: Path):
    """Sampled at the rollout temperature, IFEval at top-p 0.7 (recipes/eval/paper.yaml), 8 samples per prompt."""
    session = open_session(load_recipe(REPO / f"recipes/{stage}.yaml", [f"paths.root={tmp_path}", "cluster=local"]))
    evaluation = session.loop.evaluation
    assert (evaluation.temperature, evaluation.top_p, evaluation.samples) == (temperature, top_p, samples)


def test_the_local_retail_stage_evaluates_one_episode_per_task_at_0_7(tmp_path: Path):
    data = load_recipe(REPO / "recipes/stage3_retail.yaml", [f"paths.root={tmp_path}", "cluster=local"]).data
    assert (data.eval_temperature, data.n_samples_per_eval_prompt) == (0.7, 1)


def test_the_local_profile_names_no_env_tag():
    text = (REPO / "recipes/cluster/local.yaml").read_text() + (REPO / "recipes/profile/local.yaml").read_text()
    for tag in ("math", "search", "retail", "ifeval"):
        assert f" {tag}" not in text.replace("stage1_math", ""), tag


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("algorithm.use_tis=true", "algorithm.use_tis"),
        ("algorithm.advantage_estimator=ppo", "algorithm.advantage_estimator"),
        ("algorithm.lr_decay_style=cosine", "algorithm.lr_decay_style"),
        ("algorithm.use_kl_loss=true algorithm.kl_loss_coef=0", "algorithm.kl_loss_coef"),
        ("rollout.dynamic_sampling_filter_path=my_pkg.filters.keep_long", "rollout.dynamic_sampling_filter_path"),
        ("rollout.over_sampling_batch_size=1", "rollout.over_sampling_batch_size must be at least"),
        ("rollout.num_steps_per_rollout=3", "rollout.global_batch_size=21 does not divide a step's 64 rollouts"),
        ("rollout.num_steps_per_rollout=null rollout.global_batch_size=128", "rollout.global_batch_size=128"),
        ("rollout.global_batch_size=32", "rollout.global_batch_size 32 is not rollout_batch_size 8"),
        ("++cluster.local.steps=3", "Key 'steps' not in 'LocalBackendSettings'"),  # a recipe key: rollout.num_rollout
        ("++cluster.local.stepz=3", "Key 'stepz' not in 'LocalBackendSettings'"),
        ("++cluster.local.max_concurrency=0", "max_concurrency must be a positive integer"),
        ("++cluster.local.tiny_hidden_size=130", "tiny_hidden_size must be a multiple of 4"),
    ],
)  # fmt: skip
def test_a_setting_the_local_backend_cannot_run_is_an_error_naming_it(override: str, named: str, tmp_path: Path):
    with pytest.raises(RecipeError, match=named.replace(".", r"\.")):
        open_session(load_recipe(MATH, [f"paths.root={tmp_path}", "cluster=local", *override.split()]))


def test_kl_and_full_fine_tuning_map_onto_the_local_stage(tmp_path: Path):
    """The paper's sequential recipe runs as it is: full fine-tuning, AdamW as the recipe says, its KL term."""
    recipe = load_recipe(MATH, [f"paths.root={tmp_path}", "cluster=local", "algorithm.use_kl_loss=true",
                                "algorithm.weight_decay=0.1", "algorithm.adam_beta2=0.98"])  # fmt: skip
    session = open_session(recipe)
    train = session.policy.train
    assert session.policy.full and session.paths.policy_dir.name == "model"  # stage1_math: lora.enabled=false
    assert (train.loss.kl.coef, train.loss.kl.kind) == (0.01, "low_var_kl")
    assert (train.weight_decay, train.adam_betas[1]) == (0.1, 0.98)
    off = open_session(load_recipe(MATH, [f"paths.root={tmp_path}", "cluster=local", "lora=r16_a32"]))
    assert not off.policy.full and off.policy.train.loss.kl.coef == 0.0  # the local profile: no KL unless asked


def test_the_slime_command_is_the_recipe_without_the_local_profile(tmp_path: Path):
    paper = load_recipe(MATH, [f"paths.root={tmp_path}"])
    assert (paper.algorithm.lr, paper.rollout.n_samples_per_prompt, paper.algorithm.use_kl_loss) == (1e-6, 16, True)
    plain = load_recipe(MATH, [f"paths.root={tmp_path}", "cluster=local", "cluster.profile=null"])
    assert plain.cluster.name == "local" and plain.rollout.n_samples_per_prompt == 16


def test_each_local_setting_comes_from_one_place():
    """A local stage's setting is the backend's own (cluster.local, typed by LocalBackendSettings) or a recipe
    key's (RECIPE_KEYS), never both (the tiny model's shape is the backend's: cluster.local.tiny_hidden_size)."""
    import dataclasses

    from aclarena_slime.local.spec import RECIPE_KEYS
    from aclarena_slime.recipes.local_section import LocalBackendSettings

    backend = {f.name for f in dataclasses.fields(LocalBackendSettings)}
    assert not backend & {key.rsplit(".", 1)[-1] for key in RECIPE_KEYS}


def test_the_recipes_dynamic_sampling_reaches_the_local_stage(tmp_path: Path, monkeypatch, capsys):
    """The authors' group filter and over-sampling (the paper recipes' rollout keys) run locally as set; the local
    profile leaves them off unless an env's local settings or the command line turn them on."""
    monkeypatch.chdir(tmp_path)
    plain = stage_sh_local(MATH)
    assert plain.loop.sampling.group_filter is None and not plain.loop.dynamic_sampling
    filt = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
    session = stage_sh_local(MATH, f"rollout.dynamic_sampling_filter_path={filt}", "rollout.over_sampling_batch_size=16",
                             "++cluster.local.max_sampling_rounds=2")  # fmt: skip
    sampling = session.loop.sampling
    assert (sampling.group_filter.path, sampling.prompts_per_round, sampling.max_rounds) == (filt, 16, 2)
    no_tool = "aclarena_slime.slime_edge.rollout.drop_no_tool"
    search = stage_sh_local(str(REPO / "recipes/stage2_search.yaml"), f"rollout.dynamic_sampling_filter_path={no_tool}",
                            "+custom.aclarena_filters.max_no_tool_fraction=0.5")  # fmt: skip
    group_filter = search.loop.sampling.group_filter
    assert group_filter.path == no_tool and group_filter.settings.max_no_tool_fraction == 0.5
    assert main([MATH, "--dry-run", f"paths.root={tmp_path}", "backend=local",
                 f"rollout.dynamic_sampling_filter_path={filt}", "rollout.over_sampling_batch_size=16"]) == 0  # fmt: skip
    assert f"groups kept by {filt}, sampled 16 prompts a round, at most 4 rounds a step" in capsys.readouterr().out


def test_the_recipes_optimiser_batch_reaches_the_local_stage(tmp_path: Path, monkeypatch, capsys):
    """slime trains a rollout in steps of rollout.global_batch_size samples (the paper's math and IF stages: two of
    2048 out of 256 x 16); the local profile takes one step per rollout (num_steps_per_rollout: 1), and either
    key on the command line runs slime's split."""
    monkeypatch.chdir(tmp_path)
    plain = stage_sh_local(MATH)
    assert plain.policy.train.minibatches == 1  # 8 prompts x 8 samples, one optimiser step
    two = stage_sh_local(MATH, "rollout.num_steps_per_rollout=2")
    assert two.policy.train.minibatches == 2
    by_size = stage_sh_local(MATH, "rollout.num_steps_per_rollout=null", "rollout.global_batch_size=16")
    assert by_size.policy.train.minibatches == 4  # 64 rollouts of 16
    paper = load_recipe(MATH, [f"paths.root={tmp_path}"]).rollout
    assert paper.samples_per_update() == 2048 and 256 * 16 // 2048 == 2
    assert main([MATH, "--dry-run", f"paths.root={tmp_path}", "backend=local", "rollout.num_steps_per_rollout=2"]) == 0
    assert "2 optimiser steps of 32 samples a step" in capsys.readouterr().out
    warm = stage_sh_local(str(REPO / "recipes/stage2_search_sft.yaml"), "rollout.num_steps_per_rollout=2")
    assert warm.kind == "sft" and warm.sft.steps_per_epoch == 2  # an SFT stage takes slime's split too


def test_a_variant_stage_builds_on_the_local_backend_and_its_records_carry_the_variant(tmp_path: Path):
    pytest.importorskip("reasoning_gym")
    from aclarena_slime.local.records import demo_records
    from aclarena_slime.local.run import _local_env
    from aclarena_slime.plugin.registry import get_environment

    variant = "reasoning_gym-word_sorting"
    session = stage_sh_local(str(REPO / "recipes/reasoning_gym.yaml"), f"paths.root={tmp_path}", f"data.env={variant}",
                             f"++env_config.{variant}.tasks=word_sorting")  # fmt: skip
    assert (session.env, dict(session.records.env_config)) == (variant, {"tasks": "word_sorting"})
    warm = session.warm_start
    assert warm is not None and warm.demos == "aclarena_envs.reasoning_gym.data.demo_turns" and warm.sft.steps > 0
    assert session.paths.output_dir == tmp_path / "runs" / variant / "local"
    records = demo_records(get_environment(session.env, session.records.env_config), 3, seed=0)  # the stage's own check
    assert {(r["metadata"]["env"], r["metadata"]["task"]) for r in records} == {(variant, "word_sorting")}
    # a parallel-MLE expert of a variant gets its plugin's local env settings
    assert _local_env("retail-small") == _local_env("retail") != {}
    assert _local_env("no_such_plugin-x") == {}
