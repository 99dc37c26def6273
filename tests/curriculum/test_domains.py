"""The paper's curricula, mixes and suite, made from one list of domains (recipes/curriculum/domains/paper.yaml).

``paper_today/`` holds the hand-written files as they were before the list: every generated curriculum must
load and compose exactly as its hand-written copy does (names, recipes, starts, experts, overrides, distill
steps, sections, and each stage's composed recipe), the suite must bind the same datasets, the parallel-MLE
mix must compose the same held-out sets.
"""

from __future__ import annotations

import dataclasses
import filecmp
import os
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from aclarena_slime.curriculum.config import load_curriculum
from aclarena_slime.curriculum.runner import stage_recipe
from aclarena_slime.evaluation.suite import SuiteError, load_suite
from aclarena_slime.recipes.compiler import load_stage_suite
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.recipes.domains import ROLE_RECIPES, load_domains

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
TODAY = Path(__file__).resolve().parent / "paper_today"
PAPER_CURRICULA = ["sequential", "replay", "kl_anchor", "oracles", "mle", "sdft_data", "local_smoke"]


def snapshot(file: Path, folder: Path, tmp: Path, compose: bool = True) -> dict:
    """What a curriculum file runs: its loaded settings, recipe paths resolved as if it lay in ``folder``,
    and (``compose``) each stage's composed recipe."""
    config = load_curriculum(file, [f"output_dir={tmp}"])
    for entry in config.stages:
        entry.recipe = str((folder / entry.recipe).resolve())  # an absolute path stays itself
    if config.monitor.suite:
        config.monitor.suite = str((folder / os.path.relpath(config.monitor.suite, file.parent.resolve())).resolve())
    out = dataclasses.asdict(config)
    out.pop("stages_from", None)  # how the stages were written, not what runs
    if compose:
        out["composed"] = {
            e.name: OmegaConf.to_yaml(OmegaConf.structured(stage_recipe(config, file, e, None))) for e in config.stages
        }
    return out


@pytest.mark.parametrize("name", PAPER_CURRICULA)
def test_each_paper_curriculum_lists_what_its_hand_written_copy_listed(name: str, tmp_path: Path):
    folder = RECIPES / "curriculum"
    new, today = (snapshot(f, folder, tmp_path, compose=False) for f in (folder / f"{name}.yaml", TODAY / f"{name}.yaml"))
    assert new == today


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER_CURRICULA)
def test_each_paper_curriculum_composes_what_its_hand_written_copy_composed(name: str, tmp_path: Path):
    folder = RECIPES / "curriculum"
    assert snapshot(folder / f"{name}.yaml", folder, tmp_path) == snapshot(TODAY / f"{name}.yaml", folder, tmp_path)


def test_the_paper_suite_binds_what_its_hand_written_copy_bound():
    assert load_stage_suite(RECIPES / "eval" / "paper.yaml") == load_stage_suite(TODAY / "eval_paper.yaml")


def test_the_parallel_mle_mix_holds_out_what_its_hand_written_copy_held_out(tmp_path: Path):
    today = OmegaConf.to_container(OmegaConf.load(TODAY / "mle_parallel_mix.yaml").eval_prompt_data)
    recipe = load_recipe(RECIPES / "mle_parallel.yaml", [f"paths.root={tmp_path}"])
    data = recipe.paths.data
    expected = [(k, v.replace("${paths.data}", data)) for k, v in today.items()]
    assert list(recipe.data.eval_prompt_data.items()) == expected  # in order: slime's --eval-prompt-data pairs


FIFTH = """
  - tag: reasoning_gym
    stage: ../../reasoning_gym.yaml
    held_out: {reasoning_gym: reasoning_gym/test.jsonl}
    eval:
      reasoning_gym: {env: reasoning_gym, stage: reasoning_gym, path: reasoning_gym/test.jsonl}
"""


@pytest.fixture(scope="module")
def five_domains(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of recipes/ whose domain list has a fifth entry (the reasoning-gym stage already on main), and no
    other file changed."""
    root = tmp_path_factory.mktemp("five") / "recipes"
    shutil.copytree(RECIPES, root)
    with (root / "curriculum" / "domains" / "paper.yaml").open("a") as out:
        out.write(FIFTH)
    changed = [p.relative_to(root) for p in root.rglob("*") if p.is_file() and not filecmp.cmp(p, RECIPES / p.relative_to(root), shallow=False)]
    assert changed == [Path("curriculum/domains/paper.yaml")]
    return root


# name: (stages with four domains, the stage the fifth domain adds)
FIFTH_STAGES = {
    "sequential": (6, "reasoning_gym"),
    "replay": (4, "replay_reasoning_gym"),
    "kl_anchor": (4, "anchor_reasoning_gym"),
    "oracles": (6, "oracle_reasoning_gym"),
    "mle": (5, "mle_reasoning_gym"),
    "sdft_data": (5, "oracle_rollouts_reasoning_gym"),
    "local_smoke": (6, "smoke_reasoning_gym"),
}


@pytest.mark.parametrize("name", PAPER_CURRICULA)
def test_a_fifth_domain_entry_joins_every_paper_curriculum(name: str, five_domains: Path, tmp_path: Path):
    four = load_curriculum(RECIPES / "curriculum" / f"{name}.yaml", [f"output_dir={tmp_path}"])
    file = five_domains / "curriculum" / f"{name}.yaml"
    five = load_curriculum(file, [f"output_dir={tmp_path}"])
    count, added = FIFTH_STAGES[name]
    assert (len(four.stages), len(five.stages)) == (count, count + 1)
    assert added in [s.name for s in five.stages] and added not in [s.name for s in four.stages]
    entry = next(s for s in five.stages if s.name == added)
    recipe = stage_recipe(five, file, entry, None)  # the role's overrides compose onto the stage recipe
    assert (recipe.name, recipe.data.env) == (added, "reasoning_gym")
    if name == "mle":
        assert (entry.expert, entry.start, recipe.lora.enabled) == ("reasoning_gym", "sdft_backbone", True)
    if name == "oracles":
        assert entry.start == "recipe" and recipe.checkpoint.load == recipe.model.torch_dist
    if name == "sdft_data":
        assert recipe.extra["debug_rollout_only"] is True
        assert recipe.extra["save_debug_rollout_data"].endswith(f"/{added}/dump/rollout_data/{{rollout_id}}.pt")
        assert recipe.checkpoint.load == "/data/aclarena/curricula/oracles/runs/oracle_reasoning_gym/checkpoint"


def test_a_fifth_domain_entry_joins_the_sdft_mixture(five_domains: Path, tmp_path: Path):
    """The SDFT backbone distills five domains' dumps, each at its threshold (the entry's default, 1.0)."""
    backbone = load_curriculum(five_domains / "curriculum" / "sdft_data.yaml", [f"output_dir={tmp_path}"]).stages[-1]
    assert backbone.distill.dumps == {"math": "oracle_rollouts_math", "search": "oracle_rollouts_search",
                                      "retail": "oracle_rollouts_retail", "ifeval": "oracle_rollouts_if",
                                      "reasoning_gym": "oracle_rollouts_reasoning_gym"}  # fmt: skip
    assert backbone.distill.thresholds == {"math": 1.0, "search": 0.4, "retail": 1.0, "ifeval": 1.0, "reasoning_gym": 1.0}


def test_a_fifth_domain_entry_joins_the_parallel_mle_mix(five_domains: Path, tmp_path: Path):
    """The parallel-MLE stage evaluates five held-out sets, one per domain, the fifth the entry's."""
    four, five = (load_recipe(root / "mle_parallel.yaml", [f"paths.root={tmp_path}"]) for root in (RECIPES, five_domains))
    assert list(five.data.eval_prompt_data) == [*four.data.eval_prompt_data, "reasoning_gym"]
    assert five.data.eval_prompt_data["reasoning_gym"] == f"{tmp_path}/data/reasoning_gym/test.jsonl"


def test_a_mix_naming_a_held_out_set_twice_is_refused(tmp_path: Path):
    root = tmp_path / "recipes"
    shutil.copytree(RECIPES, root)
    with (root / "curriculum" / "domains" / "paper.yaml").open("a") as out:
        out.write(FIFTH.replace("{reasoning_gym: reasoning_gym/test.jsonl}", "{ifeval: reasoning_gym/test.jsonl}"))
    with pytest.raises(RecipeError, match="the held-out set 'ifeval' is named twice"):
        load_recipe(root / "mle_parallel.yaml", [f"paths.root={tmp_path}"])


def test_a_fifth_domain_entry_joins_the_paper_suite(five_domains: Path):
    four = load_stage_suite(RECIPES / "eval" / "paper.yaml")
    five = load_stage_suite(five_domains / "eval" / "paper.yaml")
    assert [d.env for d in five.datasets] == [*[d.env for d in four.datasets], "reasoning_gym"]
    assert len({d.env for d in five.datasets}) == 5
    added = five.datasets[-1]
    assert (added.name, added.stage, added.path) == ("reasoning_gym", "reasoning_gym", "reasoning_gym/test.jsonl")
    assert added.max_response_len == 1024  # from the stage it reproduces (recipes/reasoning_gym.yaml)


def _curriculum(tmp_path: Path, body: str) -> Path:
    (tmp_path / "domains").mkdir(exist_ok=True)
    file = tmp_path / "c.yaml"
    file.write_text(f"name: c\noutput_dir: {tmp_path / 'out'}\n{body}")
    return file


def _domains(tmp_path: Path, text: str) -> None:
    (tmp_path / "domains").mkdir(exist_ok=True)
    (tmp_path / "domains" / "list.yaml").write_text(text)


PLAN = "aclarena_slime.recipes.domains"


@pytest.mark.parametrize(
    ("body", "domains", "message"),
    [
        (f"stages: [{{name: a, recipe: {RECIPES}/stage1_math.yaml}}]\n"
         f"stages_from: {{domains: domains/list.yaml, plan: {PLAN}.sequential}}\n", None, "stages or stages_from"),
        (f"stages_from: {{domains: domains/list.yaml, plan: {PLAN}.chain, options: {{prefix: x, typo: 1}}}}\n",
         None, r"unknown option\(s\) \['typo'\]"),
        (f"stages_from: {{domains: domains/list.yaml, plan: {PLAN}.chain}}\n", None, "chain: options.prefix is required"),
        (f"stages_from: {{domains: domains/list.yaml, plan: {PLAN}.nothing}}\n", None, "cannot load the plan"),
        (f"stages_from: {{domains: domains/list.yaml, plan: {PLAN}.sequential}}\n",
         f"domains: [{{tag: math, stage: {RECIPES}/stage1_math.yaml}}, {{tag: math, name: m2, stage: x.yaml}}]\n",
         "every domain needs its own tag"),
        (f"stages_from: {{domains: domains/list.yaml, plan: {PLAN}.sequential}}\n", "domains: [{tag: math}]\n",
         r"no value: domains\[0\]\.stage"),
        (f"stages_from: {{domains: domains/missing.yaml, plan: {PLAN}.sequential}}\n", None, "missing.yaml"),
    ],  # fmt: skip
    ids=["both", "unknown-option", "missing-option", "unknown-plan", "repeated-tag", "no-stage", "no-list"],
)
def test_a_bad_domain_list_or_plan_is_refused_with_the_reason(tmp_path: Path, body: str, domains, message: str):
    _domains(tmp_path, domains or f"domains: [{{tag: math, stage: {RECIPES}/stage1_math.yaml}}]\n")
    with pytest.raises(RecipeError, match=message):
        load_curriculum(_curriculum(tmp_path, body))


def test_a_suite_takes_datasets_or_datasets_from_and_no_dataset_twice(tmp_path: Path):
    _domains(tmp_path, "domains: [{tag: a, eval: {x: {env: math, demo: 2}}}, {tag: b, eval: {x: {env: ifeval, demo: 2}}}]\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text("datasets_from: domains/list.yaml\ndatasets: {y: {env: math, demo: 1}}\n")
    with pytest.raises(SuiteError, match="datasets or datasets_from"):
        load_suite(suite)
    suite.write_text("datasets_from: domains/list.yaml\n")
    with pytest.raises(SuiteError, match=r"domain 'b' repeats the dataset\(s\) \['x'\]"):
        load_suite(suite)


@pytest.mark.parametrize("path", sorted((RECIPES / "curriculum" / "domains").glob("*.yaml")), ids=lambda p: p.stem)
def test_each_shipped_domain_list_names_recipes_that_exist(path: Path):
    domains = load_domains(path)
    assert [d.tag for d in domains] == ["math", "search", "retail", "ifeval"]
    for domain in domains:
        for role in ROLE_RECIPES:
            recipe = getattr(domain, role)
            assert recipe is None or Path(recipe).is_file(), f"{domain.tag}.{role}: {recipe}"
        assert domain.eval and all(entry["env"] == domain.tag for entry in domain.eval.values())
