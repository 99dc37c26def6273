"""Every YAML under recipes/ composed and validated; the compiler's flags all exist; overrides work."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import GROUPS, RecipeError, load_recipe
from aclarena_slime.recipes.flags import UnknownFlagError, known_flags

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
STAGE_RECIPES = sorted(RECIPES.glob("*.yaml"))
GROUP_FILES = sorted(p for g in GROUPS for p in (RECIPES / g).glob("*.yaml"))
CURRICULA = sorted((RECIPES / "curriculum").glob("*.yaml"))
EVAL_SUITES = sorted((RECIPES / "eval").glob("*.yaml"))
DOMAIN_LISTS = sorted((RECIPES / "curriculum" / "domains").glob("*.yaml"))  # read by the curricula and suites
# The envs' parts of a backend profile: recipes/env/<profile>/<tag>.yaml
ENV_PROFILES = sorted(p for p in (RECIPES / "env").glob("*/*.yaml"))
# Plugin paths referenced before their modules exist (none left: the distillation plugins landed).
PENDING_PLUGINS: set[str] = set()


def compiled(name: str, *overrides: str, tmp: Path):
    recipe = load_recipe(RECIPES / f"{name}.yaml", [f"paths.root={tmp}", *overrides])
    return recipe, compile_recipe(recipe)


def flag_value(argv: list[str], flag: str) -> list[str]:
    at = argv.index(flag)
    values = []
    for arg in argv[at + 1 :]:
        if arg.startswith("--"):
            break
        values.append(arg)
    return values


def test_every_yaml_under_recipes_is_covered():
    """No silent skipping: each YAML is a stage recipe, a group option, a curriculum or an eval suite."""
    covered = set(STAGE_RECIPES) | set(GROUP_FILES) | set(CURRICULA) | set(EVAL_SUITES) | set(ENV_PROFILES)
    covered |= set(DOMAIN_LISTS)  # each loaded by tests/curriculum/test_domains.py
    covered |= {RECIPES / "fidelity" / "authors.yaml"}  # data, checked by test_fidelity.py
    every = set(RECIPES.rglob("*.yaml")) | set(RECIPES.rglob("*.yml"))
    assert every - covered == set()
    assert len(STAGE_RECIPES) >= 14


@pytest.mark.parametrize(
    "path", STAGE_RECIPES + GROUP_FILES + CURRICULA + ENV_PROFILES + DOMAIN_LISTS, ids=lambda p: str(p.relative_to(RECIPES))
)
def test_each_yaml_opens_with_the_command_that_runs_it(path: Path):
    lines = path.read_text().splitlines()
    first = lines[1] if lines[0] == "# @package _global_" else lines[0]
    assert first.startswith("# ") and ("launch/stage.sh" in first or "launch/curriculum.sh" in first or "e.g." in first)


@pytest.mark.parametrize("path", STAGE_RECIPES, ids=lambda p: p.stem)
def test_stage_recipe_compiles_to_known_flags(path: Path, tmp_path: Path):
    recipe, command = compiled(path.stem, tmp=tmp_path)
    flags = [a for a in command.train_args if a.startswith("--")]
    assert set(flags) <= known_flags()
    assert len(flags) == len(set(flags)), "a flag emitted twice"
    assert flag_value(command.train_args, "--custom-config-path") == [
        str(tmp_path / "runs" / recipe.name / "custom_config.yaml")
    ]
    assert flag_value(command.train_args, "--save") == [recipe.checkpoint.save]
    env_config = command.custom_config["aclarena_env_config"]
    if recipe.kind != "sft":
        assert flag_value(command.train_args, "--custom-generate-function-path") == ["aclarena_slime.slime_edge.rollout.generate"]
        assert recipe.data.env in env_config
    yaml.safe_dump(command.custom_config)  # plain data only
    shlex.split(command.shell("http://127.0.0.1:8265").replace("\\\n", " "))


@pytest.mark.parametrize("option", GROUP_FILES, ids=lambda p: str(p.relative_to(RECIPES)))
def test_each_group_option_composes_into_a_stage(option: Path, tmp_path: Path):
    """Each option is selected explicitly on top of stage2_search, composed, typed and compiled."""
    group, name = option.parent.name, option.stem
    tag = yaml.safe_load(option.read_text())["env"] if group == "data" else name
    overrides = [] if group in ("env", "service") else [f"{group}={name}"]
    if group == "profile":  # a backend profile is picked by the cluster (cluster=local names profile local)
        overrides = [f"cluster.profile={name}"]
    if group == "data" and tag == "mixture":
        overrides.append("kind=sft")
    elif group in ("data", "env") and tag != "search":  # stage2_search already has search + retriever
        overrides.append(f"+env@env_config.{tag}={tag}")
    if group == "lora":
        overrides.append("cluster.perf.sequence_parallel=false")  # LoRA refuses it (paper_2x8 sets it)
    if group == "service" and name != "retriever" or tag == "retail":
        overrides.append("+service@services.user_sim=user_sim")  # the retail env talks to it
    recipe, command = compiled("stage2_search", *overrides, tmp=tmp_path)
    assert set(a for a in command.train_args if a.startswith("--")) <= known_flags()
    if group == "env":
        assert name in command.custom_config["aclarena_env_config"]


@pytest.mark.parametrize("path", EVAL_SUITES, ids=lambda p: p.stem)
def test_eval_suites_parse(path: Path):
    from aclarena_slime.recipes.compiler import load_stage_suite

    assert load_stage_suite(path).datasets


def test_stage2_search_has_search_plugins_and_retriever(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("aclarena_slime.recipes.addresses.routable_ip", lambda: "10.9.8.7")
    recipe, command = compiled("stage2_search", tmp=tmp_path)
    argv = command.train_args
    assert flag_value(argv, "--custom-rm-path") == ["aclarena_slime.slime_edge.rollout.reward"]
    assert flag_value(argv, "--advantage-estimator") == ["gspo"]
    assert flag_value(argv, "--n-samples-per-prompt") == ["8"]
    assert flag_value(argv, "--load") == [str(tmp_path / "runs" / "stage2_search_sft" / "checkpoint")]  # SeaSFT
    retriever = command.services["retriever"]
    assert (
        command.custom_config["aclarena_env_config"]["search"]["retriever_url"]
        == retriever.url + "/retrieve"
        == "http://10.9.8.7:8000/retrieve"  # two nodes: the head's address, reachable from the rollout's node
    )


def test_override_changes_the_emitted_flag(tmp_path: Path):
    _, command = compiled("stage1_math", "algorithm.lr=3e-6", "rollout.n_samples_per_prompt=32", tmp=tmp_path)
    assert flag_value(command.train_args, "--lr") == ["3e-06"]
    assert flag_value(command.train_args, "--n-samples-per-prompt") == ["32"]
    _, command = compiled("stage1_math", "cluster=single_8", tmp=tmp_path)
    assert flag_value(command.train_args, "--actor-num-nodes") == ["1"]


def test_unknown_key_fails_naming_it(tmp_path: Path):
    with pytest.raises(RecipeError, match="kl_coeff"):
        compiled("stage1_math", "algorithm.kl_coeff=0.1", tmp=tmp_path)
    with pytest.raises(RecipeError, match="lr_typo"):
        compiled("stage1_math", "+algorithm.lr_typo=0.1", tmp=tmp_path)


def test_unknown_flag_in_a_free_form_section_fails_naming_it(tmp_path: Path):
    with pytest.raises(UnknownFlagError, match="algorithm.extra.use_kl_los.*--use-kl-loss"):
        compiled("stage1_math", "+algorithm.extra.use_kl_los=true", tmp=tmp_path)


def test_a_flag_set_twice_is_an_error(tmp_path: Path):
    with pytest.raises(RecipeError, match="--lr is set twice"):
        compiled("stage1_math", "+extra.lr=1e-5", tmp=tmp_path)


def test_mle_recipe_carries_lora_hooks_and_settings(tmp_path: Path):
    from aclarena_slime.lora.config import ADAPTER_PARAM_PATTERN, LoraConfig

    recipe, command = compiled("mle_search", tmp=tmp_path)
    argv = command.train_args
    assert flag_value(argv, "--custom-model-provider-path") == ["aclarena_slime.slime_edge.lora.model_provider"]
    assert flag_value(argv, "--only-train-params-name-list") == [ADAPTER_PARAM_PATTERN]
    assert flag_value(argv, "--load") == [str(tmp_path / "runs" / "sdft_backbone" / "checkpoint")]
    lora = LoraConfig.from_mapping(command.custom_config["aclarena_lora"])
    assert (lora.rank, lora.alpha, lora.adapter_name) == (16, 32.0, "search")


MLE_RECIPES = ["mle_math", "mle_search", "mle_retail", "mle_if"]


@pytest.mark.parametrize("name", MLE_RECIPES)
def test_lora_stage_rollouts_sample_from_the_adapter_being_trained(name: str, tmp_path: Path):
    """Without aclarena_experts the rollout sends no lora_path and SGLang samples from the bare backbone."""
    from aclarena_slime.experts import ExpertTable

    recipe, command = compiled(name, tmp=tmp_path)
    adapter = command.custom_config["aclarena_lora"]["adapter_name"]
    assert command.custom_config["aclarena_experts"] == {recipe.data.env: adapter}
    assert ExpertTable.from_mapping(command.custom_config["aclarena_experts"]).adapter_for(recipe.data.env) == adapter


def test_lora_stage_refuses_another_adapter_for_its_own_env(tmp_path: Path):
    with pytest.raises(RecipeError, match="experts.math"):
        compiled("mle_math", "+experts.math=old_math", tmp=tmp_path)
    _, command = compiled("mle_math", "+experts.search=search", tmp=tmp_path)
    assert command.custom_config["aclarena_experts"] == {"search": "search", "math": "math"}


def test_lora_sync_defaults_to_disk_under_the_stage_checkpoint(tmp_path: Path):
    from aclarena_slime.lora.config import LoraConfig

    recipe, command = compiled("mle_math", tmp=tmp_path)
    lora = LoraConfig.from_mapping(command.custom_config["aclarena_lora"])
    assert (lora.sync_mode, lora.sync_dir) == ("disk", f"{recipe.checkpoint.save}/adapters")
    _, command = compiled("mle_math", "lora.sync_dir=/shared/adapters", tmp=tmp_path)
    assert command.custom_config["aclarena_lora"]["sync_dir"] == "/shared/adapters"


@pytest.mark.parametrize("name", MLE_RECIPES)
def test_mle_experts_are_served_on_the_backbone_they_train_on(name: str, tmp_path: Path):
    """SGLang loads --hf-checkpoint: for an MLE expert, the HF export of the SDFT iteration it loads (--ckpt-step),
    not the base model and not the backbone's last export."""
    _, sdft = compiled("sdft_backbone", tmp=tmp_path)
    _, mle = compiled(name, tmp=tmp_path)
    (save,) = flag_value(sdft.train_args, "--save")
    (step,) = flag_value(mle.train_args, "--ckpt-step")
    assert flag_value(mle.train_args, "--hf-checkpoint") == [f"{save}/hf_iter_{step}"]
    assert flag_value(mle.train_args, "--load") == [save]


def test_save_hf_must_be_one_folder(tmp_path: Path):
    with pytest.raises(RecipeError, match="save_hf"):
        compiled("sdft_backbone", "checkpoint.save_hf='/x/hf_{rollout_id}'", tmp=tmp_path)


@pytest.mark.parametrize("name", MLE_RECIPES)
def test_lora_stages_run_without_sequence_parallelism(name: str, tmp_path: Path):
    _, command = compiled(name, tmp=tmp_path)
    assert "--sequence-parallel" not in command.train_args
    with pytest.raises(RecipeError, match="cluster.perf.sequence_parallel sets --sequence-parallel"):
        compiled(name, "cluster.perf.sequence_parallel=true", tmp=tmp_path)
    with pytest.raises(RecipeError, match="extra.sequence_parallel"):
        compiled(name, "cluster.perf.sequence_parallel=false", "+extra.sequence_parallel=true", tmp=tmp_path)
    with pytest.raises(RecipeError, match="--save-hf"):
        compiled(name, "++checkpoint.save_hf=/x/hf", tmp=tmp_path)


@pytest.mark.parametrize("path", STAGE_RECIPES, ids=lambda p: p.stem)
def test_rl_recipes_keep_env_failed_samples_out_of_group_baselines(path: Path, tmp_path: Path):
    recipe, command = compiled(path.stem, tmp=tmp_path)
    expected = {
        "rl": ["aclarena_slime.slime_edge.rollout.reward_post_process"],
        "mopd": ["aclarena_slime.slime_edge.mopd.mopd_post_process"],
    }.get(recipe.kind)
    if expected is None:
        assert "--custom-reward-post-process-path" not in command.train_args
    else:
        assert flag_value(command.train_args, "--custom-reward-post-process-path") == expected


def test_bad_lora_setting_names_it(tmp_path: Path):
    with pytest.raises(RecipeError, match="rank"):
        compiled("mle_math", "lora.rank=0", tmp=tmp_path)


def test_sdft_and_mopd_reference_the_distillation_plugins(tmp_path: Path):
    _, sdft = compiled("sdft_backbone", tmp=tmp_path)
    assert flag_value(sdft.train_args, "--data-source-path") == ["aclarena_slime.slime_edge.data_source.BalancedDataSource"]
    assert "--custom-generate-function-path" not in sdft.train_args
    assert "--advantage-estimator" not in sdft.train_args
    _, mopd = compiled("mopd", tmp=tmp_path)
    assert flag_value(mopd.train_args, "--custom-rm-path") == ["aclarena_slime.slime_edge.mopd.teacher_log_probs_reward"]
    assert set(mopd.custom_config["aclarena_env_config"]) == {"math", "search", "retail"}
    assert set(mopd.services) == {"retriever", "user_sim"}


@pytest.mark.parametrize("path", STAGE_RECIPES, ids=lambda p: p.stem)
def test_plugin_paths_resolve(path: Path, tmp_path: Path):
    import importlib

    recipe, _ = compiled(path.stem, tmp=tmp_path)
    for dotted in vars(recipe.plugins).values():
        if not dotted or not dotted.startswith("aclarena_slime.") or dotted in PENDING_PLUGINS:
            continue
        module, _, attr = dotted.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attr))


def test_missing_recipe_file_is_a_clear_error(tmp_path: Path):
    with pytest.raises(RecipeError, match="no such recipe"):
        load_recipe(tmp_path / "nope.yaml")


def test_mle_experts_load_the_authors_sdft_iteration(tmp_path: Path):
    """Which checkpoint is an explicit setting: --ckpt-step, with SGLang serving that iteration's export."""
    # one backbone for every expert, the authors' iteration 1000, which slime writes as iter_0000999
    # (recipes/FIDELITY.md: the authors' search LoRA takes iteration 500)
    for name, step in (("mle_math", 999), ("mle_search", 999)):
        argv = compiled(name, tmp=tmp_path)[1].train_args
        assert flag_value(argv, "--ckpt-step") == [str(step)]
        assert flag_value(argv, "--hf-checkpoint") == [f"{tmp_path}/runs/sdft_backbone/checkpoint/hf_iter_{step}"]
    backbone = load_recipe(RECIPES / "sdft_backbone.yaml", [f"paths.root={tmp_path}"])
    for name in ("mle_math", "mle_search", "mle_retail", "mle_if"):
        step = load_recipe(RECIPES / f"{name}.yaml", [f"paths.root={tmp_path}"]).checkpoint.ckpt_step
        # slime saves iteration = rollout id (0-based) when (id + 1) % save_interval == 0
        assert (step + 1) % backbone.checkpoint.save_interval == 0, f"{name}: iteration {step} is never saved"
    with pytest.raises(ValueError, match="ckpt_step"):
        load_recipe(RECIPES / "mle_math.yaml", [f"paths.root={tmp_path}", "checkpoint.ckpt_step=0"])


@pytest.mark.parametrize("path", ENV_PROFILES, ids=lambda p: str(p.relative_to(RECIPES)))
def test_each_env_part_of_a_backend_profile_maps_onto_its_backend(path: Path, tmp_path: Path):
    """recipes/env/local/<tag>.yaml: composed by cluster=local for a stage of that env, mapped without error."""
    from aclarena_slime.local.session import open_session

    profile, tag = path.parent.name, path.stem
    assert profile == "local"  # the one backend profile so far
    stage = next(p for p in STAGE_RECIPES if load_recipe(p, [f"paths.root={tmp_path}"]).data.env == tag)
    recipe = load_recipe(stage, [f"paths.root={tmp_path}", "cluster=local"])
    part = yaml.safe_load(path.read_text())
    session = open_session(recipe)
    if "rollout" in part:
        assert session.engine.budgets.max_response_len == part["rollout"]["rollout_max_response_len"]
    for key, value in part.get("cluster", {}).get("local", {}).items():
        assert session.settings["local"][key] == value, key


def test_the_optimiser_batch_is_checked_as_slime_asserts_it(tmp_path: Path):
    """slime's global batch: global_batch_size, or the rollout's samples over num_steps_per_rollout; both set
    must agree, and a rollout must hold one step (slime/utils/arguments.py, slime/utils/dp_schedule.py)."""
    _, command = compiled("stage1_math", "rollout.global_batch_size=null", "++rollout.num_steps_per_rollout=4",
                          tmp=tmp_path)  # fmt: skip
    assert flag_value(command.train_args, "--num-steps-per-rollout") == ["4"]
    assert "--global-batch-size" not in command.train_args  # slime derives it: 256 x 16 // 4
    with pytest.raises(RecipeError, match="global_batch_size 2048 is not rollout_batch_size 256"):
        compiled("stage1_math", "++rollout.num_steps_per_rollout=4", tmp=tmp_path)
    with pytest.raises(RecipeError, match="2048 is not between 1 and a rollout's 1024 samples"):
        compiled("stage1_math", "rollout.n_samples_per_prompt=4", tmp=tmp_path)
    with pytest.raises(RecipeError, match="global_batch_size 0 is not between 1"):
        compiled("stage1_math", "rollout.global_batch_size=0", tmp=tmp_path)
    with pytest.raises(RecipeError, match="slime needs rollout.global_batch_size or rollout.num_steps_per_rollout"):
        compiled("stage1_math", "rollout.global_batch_size=null", tmp=tmp_path)


@pytest.mark.parametrize("key", ["rollout_batch_size", "n_samples_per_prompt", "num_rollout", "rollout_max_response_len"])
def test_a_negative_rollout_count_is_refused_as_not_positive(key: str, tmp_path: Path):
    """Found by fault injection: rollout_batch_size=-2 was refused as an optimiser batch that does not fit."""
    with pytest.raises(RecipeError, match=f"rollout.{key} must be positive, got -2"):
        compiled("stage1_math", f"rollout.{key}=-2", tmp=tmp_path)


VARIANT = "reasoning_gym-spell_backward"


def test_a_variant_stage_composes_with_its_own_env_section_and_its_plugins_local_profile(tmp_path: Path):
    """``data.env=PLUGIN-VARIANT``: Hydra takes the hyphenated key in an ``env_config.`` override and in a defaults
    package, and on cluster=local the plugin's env/local/reasoning_gym.yaml applies (its warm-start demos)."""
    overrides = [f"paths.root={tmp_path}", f"data.env={VARIANT}", f"+env@env_config.{VARIANT}=reasoning_gym",
                 f"++env_config.{VARIANT}.tasks=spell_backward"]  # fmt: skip
    recipe = load_recipe(RECIPES / "reasoning_gym.yaml", [*overrides, "cluster=local"])
    assert recipe.name == VARIANT and recipe.data.prompt_data == f"{tmp_path}/data/{VARIANT}/train.jsonl"
    assert recipe.env_config[VARIANT]["tasks"] == "spell_backward"
    assert recipe.env_config[VARIANT]["max_answer_chars"] == 2000  # the plugin's settings file, under the variant
    assert recipe.cluster.local.warm_start_demos == "aclarena_envs.reasoning_gym.data.demo_turns"
    assert load_recipe(RECIPES / "reasoning_gym.yaml", overrides).cluster.local.warm_start_demos is None


def test_a_variants_local_profile_applies_its_plugins_env_settings_to_the_variant(tmp_path: Path):
    retail = load_recipe(RECIPES / "stage3_retail.yaml", [f"paths.root={tmp_path}", "data.env=retail-small", "cluster=local"])
    assert retail.env_config["retail-small"]["user"]["kind"] == "llm"  # recipes/env/local/retail.yaml's user
    assert retail.env_config["retail-small"]["user"]["base_url"] == "{local_engine}/v1"
    assert retail.cluster.local.warm_start_steps == 0
    # a stage without a section of the plugin's own gets none from the file: it served the variant
    search = load_recipe(RECIPES / "reasoning_gym.yaml", [f"paths.root={tmp_path}", "data.env=search-nq", "cluster=local"])
    assert search.env_config["search-nq"]["topk"] == 1 and "search" not in search.env_config
    assert search.cluster.local.warm_start_demos == "aclarena_envs.search.data.demo_turns"


def test_a_variant_stage_without_its_env_section_names_the_plugins_group_option(tmp_path: Path):
    with pytest.raises(RecipeError, match=rf"no env_config for the data's env tag '{VARIANT}' \(add "
                       rf"env@env_config.{VARIANT}: reasoning_gym to defaults"):  # fmt: skip
        load_recipe(RECIPES / "reasoning_gym.yaml", [f"paths.root={tmp_path}", f"data.env={VARIANT}"])


def test_a_stages_tasks_replace_the_reasoning_gym_default_rather_than_mixing_with_it(tmp_path: Path):
    """A variant started from recipes/env/reasoning_gym.yaml is the task family it names, not a mix with the default."""
    recipe = load_recipe(RECIPES / "reasoning_gym.yaml", [f"paths.root={tmp_path}", f"data.env={VARIANT}",
                         f"+env@env_config.{VARIANT}=reasoning_gym", f"env_config.{VARIANT}.tasks={{word_sorting: 1}}"])  # fmt: skip
    assert recipe.env_config[VARIANT]["tasks"] == {"word_sorting": 1}
