"""The replay and KL-anchor curricula: compiled for the cluster profiles, run on the local profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aclarena_slime.curriculum.manifest import MANIFEST_NAME
from aclarena_slime.curriculum.runner import CurriculumFailed, run_curriculum
from aclarena_slime.curriculum.sections import DATA_SOURCE
from aclarena_slime.distill.balanced_source import ReplaySettings
from aclarena_slime.launcher.stage import StageResult
from aclarena_slime.local.records import replay_mixture, stage_env_configs
from aclarena_slime.local.session import open_session
from aclarena_slime.recipes.compiler import compile_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
# The baselines' plumbing on the local backend, not learning: two GRPO steps and no demo warm start.
_SHORT_LOCAL = "cluster=local, rollout.num_rollout=2, cluster.local.warm_start_steps=0"
CURRICULA = RECIPES / "curriculum"


class FakeRunner:
    """Keeps each stage's recipe and 'trains' by naming a checkpoint folder (slime is not run here)."""

    def __init__(self) -> None:
        self.recipes: list = []

    def __call__(self, recipe) -> StageResult:
        self.recipes.append(recipe)
        return StageResult(0, "fake", checkpoint=recipe.checkpoint.save)


def _run_fake(name: str, tmp_path: Path, cluster: str, *extra: str) -> FakeRunner:
    runner = FakeRunner()
    overrides = [f"output_dir={tmp_path / 'out'}", f"overrides=[paths.root={tmp_path},backend=slime,cluster={cluster}]"]
    run_curriculum(CURRICULA / f"{name}.yaml", [*overrides, *extra], runner=runner, evaluator=lambda *_: None)
    return runner


@pytest.mark.parametrize("cluster", ["paper_2x8", "single_8"])
def test_replay_compiles_for_the_cluster_profiles(tmp_path: Path, cluster: str):
    runner = _run_fake("replay", tmp_path, cluster)
    first, _, third, fourth = runner.recipes
    assert first.plugins.data_source_path is None and first.custom.aclarena_replay is None
    replay = third.custom.aclarena_replay
    assert replay.current == "retail" and replay.share == 0.25 and replay.rule == "uniform"
    data = tmp_path / "data"
    assert replay.data == {"math": f"{data}/math/train.jsonl", "search": f"{data}/search/train.jsonl"}
    assert set(fourth.custom.aclarena_replay.data) == {"math", "search", "retail"}
    # every replayed env can run in the stage: its settings and its services (the retriever) came along
    assert set(third.env_config) == {"math", "search", "retail"} and set(third.services) == {"retriever", "user_sim"}
    command = compile_recipe(third)
    argv = command.train_args
    assert argv[argv.index("--data-source-path") + 1] == DATA_SOURCE
    assert command.custom_config["aclarena_replay"] == replay.to_dict()
    assert set(command.custom_config["aclarena_env_config"]) == {"math", "search", "retail"}
    assert third.cluster.name == cluster


def test_replay_leaves_out_the_domains_it_excludes(tmp_path: Path):
    """``replay.exclude`` (the arena's retail, which cannot learn on a CPU): the later stages neither replay the
    domain's prompts nor its warm-start demos, nor run its env; the other earlier domains are replayed as before."""
    runner = _run_fake("replay", tmp_path, "paper_2x8", "replay.exclude=[retail]")
    fourth = runner.recipes[3].custom.aclarena_replay
    assert set(fourth.data) == {"math", "search"} and fourth.exclude == ["retail"]
    assert "retail" not in runner.recipes[3].env_config and "user_sim" not in runner.recipes[3].services
    assert compile_recipe(runner.recipes[3]).custom_config["aclarena_replay"]["exclude"] == ["retail"]
    with pytest.raises(ValueError, match="replay.yaml: Invalid value"):  # a tag, not a list: named at load
        _run_fake("replay", tmp_path / "bad", "paper_2x8", "replay.exclude=retail")
    with pytest.raises(ValueError, match="replay.exclude must be a list of env tags"):  # slime's side reads JSON
        ReplaySettings(exclude="retail")


def test_a_replay_exclude_that_names_no_stage_stops_the_curriculum_before_it_trains(tmp_path: Path):
    """A misspelt tag (``retial``) would leave retail replayed: the curriculum says so before its first stage."""
    runner = FakeRunner()
    overrides = [f"output_dir={tmp_path / 'out'}", f"overrides=[paths.root={tmp_path},backend=slime]"]
    with pytest.raises(CurriculumFailed, match=r"replay.exclude names \['retial'\].*math, search, retail, ifeval"):
        run_curriculum(CURRICULA / "replay.yaml", [*overrides, "replay.exclude=[retial]"], runner=runner,
                       evaluator=lambda *_: None)  # fmt: skip
    assert runner.recipes == []


@pytest.mark.slow
def test_replay_runs_on_the_local_profile(tmp_path: Path):
    """Two real stages on the local backend (tiny model): the second replays the first's env."""
    path = tmp_path / "replay.yaml"
    path.write_text(
        f"name: replay_local\noutput_dir: {tmp_path / 'out'}\noverrides: [{_SHORT_LOCAL}, paths.root={tmp_path}]\n"
        f"stages:\n  - {{name: r_math, recipe: {RECIPES}/stage1_math.yaml}}\n"
        f"  - {{name: r_if, recipe: {RECIPES}/stage4_if.yaml}}\n"
        "replay: {enabled: true, share: 0.5}\n"
        "monitor: {enabled: true, interval: 1, demo_size: 2, max_response_len: 16}\n"
    )
    run_curriculum(path)
    data = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    first, second = data["stages"]  # the sequential recipes: full fine-tuning, chained through the model folder
    assert first["status"] == second["status"] == "done" and second["loaded"] == first["checkpoint"]
    assert Path(first["checkpoint"], "config.json").exists() and first["adapter"] is None
    metrics = json.loads((Path(second["checkpoint"]).parent / "metrics.json").read_text())
    replay = metrics["config"]["custom"]["aclarena_replay"]  # the recipe's section, as the stage ran it
    assert list(replay["data"]) == ["math"] and replay["current"] == "ifeval"
    assert [s for s, _ in second["monitor"]["curves"]["math"]] == [0, 1, 2]  # the monitor watched math
    assert second["cost"]["trainer_steps"] == 2 and second["cost"]["rollout_tokens"] > 0 and second["cost"]["counted"]


def _retail_data(root: Path) -> Path:
    """A τ³-shaped retail data folder with one train task: enough for the env's demo records."""
    root.mkdir(parents=True)
    (root / "db.json").write_text(json.dumps({"products": {}, "users": {}, "orders": {}}))
    (root / "tasks.json").write_text(json.dumps([{"id": "t0", "user_scenario": {}}]))
    (root / "split_tasks.json").write_text(json.dumps({"train": ["t0"]}))
    (root / "policy.md").write_text("# policy\n")
    return root


def test_local_replay_runs_the_earlier_env_with_its_own_stages_settings(tmp_path: Path):
    """A setting every stage gets for an env (the arena's ``++env_config.retail.data_dir``) gives a later stage a
    partial entry for it; the replayed env still runs with what its own stage ran on the local backend (the
    local retail user, served by the replaying stage's engine), not with that entry (the arena's IFEval crash)."""
    data = _retail_data(tmp_path / "tau3-retail")
    path = tmp_path / "replay.yaml"
    path.write_text(
        f"name: replay_retail\noutput_dir: {tmp_path / 'out'}\n"
        f"overrides: [cluster=local, paths.root={tmp_path}, '++env_config.retail.data_dir={data}']\n"
        f"stages:\n  - {{name: r_retail, recipe: {RECIPES}/stage3_retail.yaml}}\n"
        f"  - {{name: r_if, recipe: {RECIPES}/stage4_if.yaml}}\n"
        "replay: {enabled: true, share: 0.5}\n"
    )
    runner = FakeRunner()
    run_curriculum(path, runner=runner, evaluator=lambda *_: None)
    retail, ifeval = (open_session(r) for r in runner.recipes)
    assert ifeval.records.replay["env_config"]["retail"] == dict(retail.records.env_config)
    url = "http://127.0.0.1:9"
    configs = stage_env_configs(ifeval.records, url, ifeval.engine.served_name)
    assert list(configs) == ["ifeval", "retail"] and configs["retail"]["user"]["base_url"] == f"{url}/v1"
    own = [{"prompt": f"p{i}", "metadata": {"env": "ifeval"}} for i in range(4)]
    # builds the replayed retail env (the crash was here)
    records = replay_mixture(ifeval.records, own, configs, ifeval.loop.sampling.prompts_per_step)
    assert [r["metadata"]["env"] for r in records].count("retail") == 2


@pytest.mark.parametrize("cluster", ["paper_2x8", "single_8"])
def test_kl_anchor_references_the_previous_stages_checkpoint(tmp_path: Path, cluster: str):
    runner = _run_fake("kl_anchor", tmp_path, cluster, "kl_anchor.coef=0.3")
    first, *rest = runner.recipes
    assert first.checkpoint.ref_load == first.model.torch_dist  # stage 1: the base model, as its recipe says
    for previous, recipe in zip(runner.recipes, rest, strict=False):
        assert recipe.checkpoint.ref_load == recipe.checkpoint.load == previous.checkpoint.save
        argv = compile_recipe(recipe).train_args
        assert argv[argv.index("--ref-load") + 1] == previous.checkpoint.save
        assert argv[argv.index("--kl-loss-coef") + 1] == "0.3" and "--use-kl-loss" in argv
    stages = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["stages"]
    assert stages[1]["ref_load"] == first.checkpoint.save  # the manifest says what each stage was anchored to
    # slime's planned cost (its token counts stay in slime's logs): the comparison table reads it
    assert stages[1]["cost"] == {"rollout_tokens": None, "trainer_steps": 500, "counted": False}


def test_kl_anchor_pins_the_reference_even_where_a_recipe_names_the_base(tmp_path: Path):
    path = tmp_path / "anchor.yaml"
    path.write_text(
        f"name: anchor\noutput_dir: {tmp_path / 'out'}\noverrides: [paths.root={tmp_path}, backend=slime]\n"
        f"stages:\n  - {{name: a1, recipe: {RECIPES}/stage1_math.yaml}}\n"
        f"  - {{name: a2, recipe: {RECIPES}/stage2_search.yaml, overrides: ['++checkpoint.ref_load=/models/base']}}\n"
        "kl_anchor: {enabled: true}\n"
    )
    runner = FakeRunner()
    run_curriculum(path, runner=runner, evaluator=lambda *_: None)
    first, second = runner.recipes
    assert second.checkpoint.ref_load == first.checkpoint.save and second.algorithm.kl_loss_coef == 0.1


@pytest.mark.slow
def test_kl_anchor_runs_on_the_local_profile(tmp_path: Path):
    path = tmp_path / "anchor.yaml"
    path.write_text(
        f"name: anchor_local\noutput_dir: {tmp_path / 'out'}\noverrides: [{_SHORT_LOCAL}, paths.root={tmp_path}]\n"
        f"stages:\n  - {{name: a_math, recipe: {RECIPES}/stage1_math.yaml}}\n"
        f"  - {{name: a_if, recipe: {RECIPES}/stage4_if.yaml}}\n"
        "kl_anchor: {enabled: true, coef: 0.2}\n"
    )
    run_curriculum(path)
    first, second = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["stages"]
    assert first["status"] == second["status"] == "done" and second["loaded"] == first["checkpoint"]
    metrics = json.loads((Path(second["checkpoint"]).parent / "metrics.json").read_text())
    algorithm, local = metrics["config"]["algorithm"], metrics["config"]["local"]
    assert algorithm["use_kl_loss"] and algorithm["kl_loss_coef"] == 0.2 and local["backbone"] == first["checkpoint"]
    assert all("kl" in step for step in metrics["steps"] if not step.get("skipped"))  # the KL term ran


def test_the_shipped_monitor_suite_compiles_into_slimes_eval_config(tmp_path: Path):
    """kl_anchor.yaml with its monitor on, for the cluster: the paper suite's earlier domains join each stage's
    eval config, and the stage gets the earlier envs' settings and services so slime's eval can run them."""
    runner = _run_fake("kl_anchor", tmp_path, "paper_2x8", "monitor.enabled=true")
    third = runner.recipes[2]
    command = compile_recipe(third)
    config = command.eval_config
    by_name = {d["name"]: d for d in config["eval"]["datasets"]}
    assert {"aime26", "nq"} <= set(by_name) and not {"single_hop", "multi_hop", "ifeval"} & set(by_name)
    assert by_name["nq"]["metadata_overrides"] == {"env": "search"}
    assert by_name["nq"]["path"] == f"{tmp_path / 'data'}/search/nq_test.jsonl@[0:500]"
    assert {"math", "search", "retail"} <= set(third.env_config) and "retriever" in third.services
    argv = command.train_args
    assert argv[argv.index("--eval-interval") + 1] == "25"
    assert command.custom_config["aclarena_monitor"]["domains"] == ["math", "search"]  # the alarm's section


def test_the_kl_anchor_section_gives_the_local_stage_its_kl_term(tmp_path: Path):
    """The curriculum writes the same section for both backends; on the local backend the KL anchor is the
    KL term to the policy the stage starts from (the previous stage's), so it differs from the sequential run."""
    from aclarena_slime.curriculum.config import KlAnchorSettings
    from aclarena_slime.curriculum.sections import anchor_overrides
    from aclarena_slime.recipes.compose import load_recipe

    base = [f"paths.root={tmp_path}", "cluster=local"]
    source = {"name": "s1", "checkpoint": str(tmp_path / "s1" / "model")}
    anchor = anchor_overrides(KlAnchorSettings(enabled=True, coef=0.1), source)
    anchored = open_session(load_recipe(RECIPES / "stage4_if.yaml", [*base, *anchor])).policy.train.loss
    sequential = open_session(load_recipe(RECIPES / "stage4_if.yaml", base)).policy.train.loss
    assert (anchored.kl.coef, anchored.kl.kind) == (0.1, "low_var_kl") and sequential.kl.coef == 0.0


def test_local_replay_carries_the_earlier_stages_gold_demos_to_the_warm_start(tmp_path: Path):
    """The replaying stage's warm start needs each earlier domain's demo-turns function, budget and bar, as that
    domain's own stage warm-started; a domain without gold demos (retail) has none to replay."""
    data = _retail_data(tmp_path / "tau3-retail")
    path = tmp_path / "replay.yaml"
    path.write_text(
        f"name: replay_demos\noutput_dir: {tmp_path / 'out'}\n"
        f"overrides: [cluster=local, paths.root={tmp_path}, '++env_config.retail.data_dir={data}']\n"
        f"stages:\n  - {{name: math, recipe: {RECIPES}/stage1_math.yaml, overrides: [rollout.rollout_max_response_len=24]}}\n"
        f"  - {{name: retail, recipe: {RECIPES}/stage3_retail.yaml}}\n"
        f"  - {{name: ifeval, recipe: {RECIPES}/stage4_if.yaml}}\n"
        "replay: {enabled: true, share: 0.25}\n"
    )
    runner = FakeRunner()
    run_curriculum(path, runner=runner, evaluator=lambda *_: None)
    replay = open_session(runner.recipes[-1]).records.replay
    assert replay["domains"] == ["math", "retail"]
    assert replay["warm_start"] == {
        "math": {"demos": "aclarena_envs.math.data.demo_turns", "max_response_len": 24, "min_reward": None}
    }
