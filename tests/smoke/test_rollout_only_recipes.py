"""The runs before the warm starts: teacher and oracle rollout-only recipes compile to slime's
``--debug-rollout-only`` with sample dumps, pass the flag gate, and run under ``--smoke`` (where slime is)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from aclarena_slime.launcher import preflight, smoke
from aclarena_slime.launcher.smoke_report import read_dumps
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import load_recipe
from aclarena_slime.recipes.flags import known_flags

REPO = Path(__file__).resolve().parents[2]
ROLLOUT_ONLY = {
    "teacher_search": ("search", 5, "3072"),
    "teacher_retail": ("retail", 8, "2048"),
    "oracle_rollouts_search": ("search", 5, "3072"),
    "oracle_rollouts_retail": ("retail", 8, "2048"),
    "oracle_rollouts_math": ("math", 16, "16384"),
    "oracle_rollouts_if": ("ifeval", 16, "16384"),
}


def flag(argv: list[str], name: str) -> list[str] | None:
    return smoke._flag_values(argv, name)


def known_parser() -> list[argparse.ArgumentParser]:
    """A parser holding every flag of the known-flags list (slime's, Megatron-LM's, SGLang's)."""
    parser = argparse.ArgumentParser(add_help=False)
    for name in sorted(known_flags()):
        parser.add_argument(name, nargs="*")
    return [parser]


@pytest.mark.parametrize("name", sorted(ROLLOUT_ONLY))
def test_rollout_only_recipes_dump_every_sample_and_pass_the_flag_gate(name, tmp_path):
    env, samples, budget = ROLLOUT_ONLY[name]
    recipe = load_recipe(REPO / "recipes" / f"{name}.yaml", [f"paths.root={tmp_path}"])
    argv = compile_recipe(recipe).train_args
    assert recipe.data.env == env and "--debug-rollout-only" in argv
    assert flag(argv, "--save-debug-rollout-data") == [f"{tmp_path}/runs/{name}/dump/rollout_data/{{rollout_id}}.pt"]
    assert flag(argv, "--n-samples-per-prompt") == [str(samples)]
    assert flag(argv, "--rollout-max-response-len") == [budget]
    for gone in ("--eval-prompt-data", "--dynamic-sampling-filter-path", "--save-hf"):
        assert gone not in argv, gone  # nothing to evaluate, filter or export: every sample is dumped
    # slime returns before the reward post-process on --debug-rollout-only; its rollout-log hook sees the batch
    assert flag(argv, "--custom-rollout-log-function-path") == ["aclarena_slime.slime_edge.rollout.rollout_log"]
    [check] = preflight.check_flags(argv, build=known_parser)
    assert check.status == "ok", check


def test_the_teachers_are_qwen3_32b_and_the_oracles_their_own_exports(tmp_path):
    for name in ("teacher_search", "teacher_retail"):
        recipe = load_recipe(REPO / "recipes" / f"{name}.yaml", [f"paths.root={tmp_path}"])
        argv = compile_recipe(recipe).train_args
        assert recipe.model.name == "Qwen3-32B" and flag(argv, "--num-layers") == ["64"]
    for domain in ("math", "search", "retail", "if"):
        recipe = load_recipe(REPO / "recipes" / f"oracle_rollouts_{domain}.yaml", [f"paths.root={tmp_path}"])
        assert recipe.model.hf_checkpoint == f"{tmp_path}/runs/oracle_{domain}/hf"
        oracle = load_recipe(REPO / "recipes" / f"oracle_{domain}.yaml", [f"paths.root={tmp_path}"])
        assert oracle.checkpoint.save_hf == recipe.model.hf_checkpoint  # the oracle leaves what its rollouts serve


@pytest.mark.parametrize("name", ["teacher_search", "teacher_retail", "oracle_rollouts_math"])
def test_the_smoke_shrinks_them_and_keeps_the_dumps(name, tmp_path):
    command = compile_recipe(load_recipe(REPO / "recipes" / f"{name}.yaml"))
    argv, _ = smoke.smoke_argv(command, model_dir=tmp_path / "model", data=(tmp_path / "train.jsonl", None),
                               engine="127.0.0.1:1234", dump=tmp_path / "dumps",
                               custom_config=tmp_path / "c.yaml")  # fmt: skip
    assert "--debug-rollout-only" in argv
    assert flag(argv, "--save-debug-rollout-data") == [str(tmp_path / "dumps" / "{rollout_id}.pt")]
    assert flag(argv, "--num-rollout") == [str(smoke.ROLLOUTS)]


@pytest.mark.slime
@pytest.mark.parametrize("name", ["teacher_search", "teacher_retail", "oracle_rollouts_math"])
def test_rollout_only_recipe_runs_under_smoke(name, tmp_path):
    if smoke.missing_slime():
        pytest.skip(smoke.missing_slime())
    out = tmp_path / name
    done = subprocess.run(
        [sys.executable, "-m", "aclarena_slime.launcher.smoke", f"recipes/{name}.yaml", "--smoke", "--smoke-dir", str(out)],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=3000,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    train = read_dumps(out / "dumps")["train"]
    assert len(train) == smoke.ROLLOUTS * smoke.PROMPTS * smoke.SAMPLES
    assert all(isinstance(sample["reward"], float) for sample in train)
