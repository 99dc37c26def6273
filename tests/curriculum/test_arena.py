"""The arena: methods as plugins expanded into curricula, and a short run from the shared base to the table."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from aclarena_slime.arena.base import BaseSettings, build_base, evaluate_policy
from aclarena_slime.arena.runner import (
    domain_sessions,
    held_out_suite,
    is_arena,
    load_arena,
    method_curriculum,
    run_arena,
)
from aclarena_slime.cli import main as cli
from aclarena_slime.curriculum.config import load_curriculum
from aclarena_slime.curriculum.methods import WARM_START_INTO_EXPERT, MethodError
from aclarena_slime.experts import EXPERTS_NAME
from aclarena_slime.plugin.contract import Task
from aclarena_slime.plugin.registry import get_environment
from aclarena_slime.recipes.compose import RecipeError
from aclarena_slime.testing.local import LEARNABLE, local_session

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"

# A method of the user's own, in the user's package: the sequential chain at half the learning rate from stage 2.
PLUGIN = '''
from aclarena_slime.curriculum.methods import FULL_FT, entry


def gentle(stages, options):
    """Sequential, but later stages train at ``lr`` (a gentler step keeps more of the earlier domains)."""
    lr = options.get("lr", 5e-4)
    return {"stages": [entry(s, FULL_FT, *([f"algorithm.lr={lr}"] if i else [])) for i, s in enumerate(stages)]}
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_methods.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_methods.gentle"


def arena_file(tmp_path: Path, methods: dict, **extra) -> Path:
    path = tmp_path / "arena.yaml"
    data = {
        "name": "t",
        "output_dir": str(tmp_path / "out"),
        "base": {"steps": 4, "records": 16, "batch_size": 8},
        "eval_size": 2,
        # tiny sizes: a 4-step warm start, 1 GRPO step of 2 prompts x 2 samples per stage, short answers
        "overrides": [
            "rollout.rollout_batch_size=2",
            "rollout.n_samples_per_prompt=2",
            "cluster.local.warm_start_steps=4",
            "cluster.local.warm_start_records=16",
        ],  # fmt: skip
        "stages": [
            {"name": "math", "recipe": str(RECIPES / "stage1_math.yaml"), "overrides": ["rollout.num_rollout=1"]},
            {
                "name": "ifeval",
                "recipe": str(RECIPES / "stage4_if.yaml"),
                "overrides": ["rollout.num_rollout=1", "rollout.rollout_max_response_len=32"],
            },
        ],  # fmt: skip
        "methods": methods,
        **extra,
    }
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_method_plugin_becomes_a_curriculum_the_runner_reads(tmp_path, plugin):
    path = arena_file(tmp_path, {"gentle": {"method": plugin, "options": {"lr": 2e-4}}})
    assert is_arena(path) and not is_arena(RECIPES / "curriculum" / "replay.yaml")
    config = load_arena(path)
    curriculum, independent = method_curriculum(config, "gentle", tmp_path / "base")
    assert not independent
    assert curriculum["overrides"][-1] == f"checkpoint.load={tmp_path / 'base'}"  # every method from the base
    math, ifeval = curriculum["stages"]
    assert "algorithm.lr=0.0002" in ifeval["overrides"] and not any("lr" in o for o in math["overrides"])
    written = tmp_path / "c.yaml"
    written.write_text(yaml.safe_dump(curriculum))
    loaded = load_curriculum(written)
    assert [s.name for s in loaded.stages] == ["math", "ifeval"] and loaded.stages[1].start == "previous"


def test_the_built_in_methods_differ_in_what_each_stage_trains(tmp_path):
    methods = {name: {"method": f"aclarena_slime.curriculum.methods.{name}"}
               for name in ("sequential", "replay", "kl_anchor", "mle", "oracles")}  # fmt: skip
    config = load_arena(arena_file(tmp_path, methods))
    made = {name: method_curriculum(config, name, tmp_path)[0] for name in methods}
    assert made["replay"]["replay"]["enabled"] and "replay" not in made["sequential"]
    kl = made["kl_anchor"]["stages"]
    assert not any("use_kl_loss" in o for o in kl[0]["overrides"])  # stage 1 has no earlier policy to anchor to
    assert "++algorithm.use_kl_loss=true" in kl[1]["overrides"]
    assert [s.get("expert") for s in made["mle"]["stages"]] == ["math", "ifeval"]
    assert all(s["start"] == "recipe" and "lora.enabled=true" in s["overrides"] for s in made["mle"]["stages"])
    # the expert's warm start trains the expert: the base stays the one backbone under every expert
    assert all(WARM_START_INTO_EXPERT in s["overrides"] for s in made["mle"]["stages"])
    assert method_curriculum(config, "oracles", tmp_path)[1]  # independent models
    assert all("lora.enabled=false" in s["overrides"] for s in made["sequential"]["stages"])


def test_each_domain_is_held_out_on_its_own_eval_size(tmp_path):
    path = arena_file(tmp_path, {"s": {"method": "aclarena_slime.curriculum.methods.sequential"}})
    data = yaml.safe_load(path.read_text())
    data["stages"][1]["eval_size"] = 3
    path.write_text(yaml.safe_dump(data))
    config = load_arena(path)
    sessions = domain_sessions(config)
    suite = held_out_suite(sessions)
    assert {d.name: d.demo for d in suite.datasets} == {"math": 2, "ifeval": 3}
    assert [(d.env, d.max_response_len, d.env_config) for d in suite.datasets] == [
        (s.env, s.eval_response_len, dict(s.records.env_config)) for s in sessions
    ]
    curriculum = method_curriculum(config, "s", tmp_path)[0]
    # the stage's own held-out records are the ones evaluated, so it never trains on them
    assert curriculum["stages"][1]["overrides"][-2] == "cluster.local.eval_size=3"
    assert curriculum["reuse"] == str(tmp_path / "out" / "seed_0" / "stages")  # shared by the seed's methods


def test_bad_methods_and_stages_are_named(tmp_path):
    config = load_arena(arena_file(tmp_path, {"x": {"method": "no_such_module.fn"}}))
    with pytest.raises(MethodError, match="cannot load the method 'no_such_module.fn'"):
        method_curriculum(config, "x", tmp_path)
    config = load_arena(arena_file(tmp_path, {"x": {"method": "aclarena_slime.curriculum.methods.kl_anchor",
                                                    "options": {"coef": -1}}}))  # fmt: skip
    with pytest.raises(MethodError, match="kl_anchor"):
        method_curriculum(config, "x", tmp_path)
    config = load_arena(arena_file(tmp_path, {"x": {"method": "aclarena_slime.curriculum.methods.mle",
                                                    "options": {"rank": 4}}}))  # fmt: skip
    with pytest.raises(MethodError, match="mle: options are lr and warm_start_lr"):
        method_curriculum(config, "x", tmp_path)
    path = arena_file(tmp_path, {"s": {"method": "aclarena_slime.curriculum.methods.sequential"}})
    data = yaml.safe_load(path.read_text())
    data["stages"][0]["name"] = "arithmetic"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RecipeError, match="stage 'arithmetic' trains env 'math'"):
        domain_sessions(load_arena(path))
    with pytest.raises(RecipeError, match="no method"):
        run_arena(path, only=["nope"])


@pytest.mark.filterwarnings("ignore:cluster.local. no warm_start_demos for env 'retail'")
def test_the_shipped_arena_file_composes_every_stage_and_method(tmp_path):
    """``recipes/curriculum/arena_local.yaml`` as a user runs it: every stage composes on the local backend,
    every method makes a curriculum the runner reads, replay leaves retail out, and math asks the bare problem."""
    config = load_arena(RECIPES / "curriculum" / "arena_local.yaml", [f"output_dir={tmp_path / 'out'}"])
    sessions = domain_sessions(config)
    assert [s.env for s in sessions] == ["math", "search", "retail", "ifeval"]
    warm = [s.warm_start.sft.steps if s.warm_start else 0 for s in sessions]
    assert warm == [400, 200, 0, 200]  # retail has no gold demos
    assert [s.policy.train.minibatches for s in sessions] == [1, 1, 1, 1]  # the arena's sizes, not the env profiles' (IFEval: 2)
    for name in config.methods:
        written = tmp_path / f"{name}.yaml"
        written.write_text(yaml.safe_dump(method_curriculum(config, name, tmp_path / "base")[0]))
        assert [s.name for s in load_curriculum(written).stages] == ["math", "search", "retail", "ifeval"]
    assert load_curriculum(tmp_path / "replay.yaml").replay.exclude == ["retail"]
    math = get_environment("math", sessions[0].records.env_config)
    record = math.demo_records(1, seed=0)[0]
    try:
        assert math.conversation(Task(record["prompt"])).messages[-1]["content"] == record["prompt"]
    finally:
        asyncio.run(math.aclose())


@pytest.mark.slow
def test_a_short_arena_gives_every_method_a_matrix_and_a_row(tmp_path, plugin, capsys):
    """Base -> (the user's method: a 2-stage chain; the oracles: each domain alone) -> the comparison."""
    methods = {"gentle": {"method": plugin}, "oracles": {"method": "aclarena_slime.curriculum.methods.oracles"}}
    index = run_arena(arena_file(tmp_path, methods))
    base = Path(index["base_model"])
    assert (base / "config.json").is_file() and json.loads((base.parent / "base.json").read_text())["sft"]
    for name in methods:
        manifest = json.loads(Path(index["methods"][name]["manifest"]).read_text())
        assert [s["status"] for s in manifest["stages"]] == ["done", "done"]
        assert all(s["eval"] for s in manifest["stages"])  # every stage evaluated on every domain
    chain = json.loads(Path(index["methods"]["gentle"]["manifest"]).read_text())["stages"]
    assert chain[0]["loaded"] == str(base) and chain[1]["start_from"] == "math"
    # the math oracle is the chain's first stage (same start, settings, seed): taken, not trained again
    oracles = json.loads(Path(index["methods"]["oracles"]["manifest"]).read_text())["stages"]
    assert oracles[0]["reused_from"] == "t_gentle:math" and oracles[0]["checkpoint"] == chain[0]["checkpoint"]
    assert "reused_from" not in oracles[1]  # the IFEval oracle starts from the base, the chain's from math
    out = tmp_path / "cmp"
    runs = [f"--run={name}={entry['manifest']}" for name, entry in index["methods"].items()]
    assert cli(["eval", "matrix", *runs, "--base", index["base_eval"], "--out", str(out), "--json"]) == 0
    rows = {m["method"]: m for m in json.loads(capsys.readouterr().out)["methods"]}
    assert set(rows) == {"gentle", "oracles"} and rows["oracles"]["independent"]
    assert set(rows["gentle"]["domains"]) == {"math", "ifeval"} and rows["gentle"]["bwt"] is not None
    assert rows["gentle"]["trainer_steps"] == 2
    matrix = json.loads((out / "gentle" / "matrix.json").read_text())
    assert matrix["stages"] == ["math", "ifeval"] and all(v is not None for row in matrix["values"] for v in row)
    assert (out / "gentle" / "heatmap.png").is_file() and "| gentle |" in (out / "comparison.md").read_text()
    # run again: the base and every stage are done; nothing is trained twice
    again = run_arena(arena_file(tmp_path, methods))
    assert again["methods"] == index["methods"]


@pytest.mark.slow
def test_mle_asks_unchanged_weights_once_and_the_memo_equals_a_fresh_evaluation(tmp_path):
    """MLE's later stages leave the frozen backbone and the earlier experts as they were: the arena's evaluation
    takes those domains from its memo (the base row's IFEval after the math stage, the math expert's answers
    after the IFEval stage) and rolls out only the new expert's domain; evaluated afresh, they are the same."""
    methods = {"mle": {"method": "aclarena_slime.curriculum.methods.mle"}}
    index = run_arena(arena_file(tmp_path, methods))
    stages = json.loads(Path(index["methods"]["mle"]["manifest"]).read_text())["stages"]
    seed_dir = Path(index["base_model"]).parents[1]
    memo = {s["name"]: json.loads((seed_dir / "mle" / "eval" / s["name"] / "memo.json").read_text()) for s in stages}
    assert memo["math"]["reused"] == ["ifeval"] and memo["ifeval"]["reused"] == ["math"]
    last, fresh = stages[-1], tmp_path / "fresh"
    model = last.get("checkpoint") or last["metrics"]["model_dir"]
    experts = Path(index["methods"]["mle"]["manifest"]).with_name(EXPERTS_NAME)
    suite = held_out_suite(domain_sessions(load_arena(arena_file(tmp_path, methods))))
    asyncio.run(evaluate_policy(suite, Path(model), str(experts), fresh, "ifeval", 0))  # no memo

    def answers(folder: Path) -> list:
        lines = [json.loads(line) for line in (folder / "samples" / "math.jsonl").read_text().splitlines()]
        return sorted((line["index"], line["reward"], line["messages"]) for line in lines)

    assert answers(fresh) == answers(seed_dir / "mle" / "eval" / "ifeval")
    summary = json.loads((seed_dir / "mle" / "eval" / "ifeval" / "summary.json").read_text())
    assert summary["domains"] == json.loads((fresh / "summary.json").read_text())["domains"]


def test_the_base_is_built_from_the_tiny_model_and_a_domain_with_gold_demos(tmp_path):
    """build_base takes the base's sessions (one per domain with gold demos) and refuses what it cannot build."""
    with pytest.raises(ValueError, match="at least one domain with gold demos"):
        build_base([], BaseSettings(), tmp_path / "none", 0)
    large = local_session(tmp_path / "s", *LEARNABLE, "data.env=math", f"++cluster.local.model={tmp_path / 'qwen'}",
                          "++cluster.local.warm_start_steps=2",
                          "++cluster.local.warm_start_demos=aclarena_envs.math.data.demo_turns")  # fmt: skip
    with pytest.raises(ValueError, match="built from the tiny model"):
        build_base([large], BaseSettings(), tmp_path / "large", 0)
