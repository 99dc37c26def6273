"""The final evaluation runs each env with its training settings (recipes/env/*.yaml), except the rows
recipes/FIDELITY.md gives a reason for; and the AIME response the audit found scores as training scores it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from aclarena_envs.math.env import MathEnvironment
from aclarena_slime.plugin.contract import Task
from aclarena_slime.recipes.compiler import load_stage_suite, read_stage

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
# Keys the suite fills from services (the machine's, not a setting), and the settings the final evaluation
# changes on purpose (FIDELITY.md, "final evaluation": accuracies, not the shaped training rewards).
SERVICES = {"retriever_url", "data_dir", "user.base_url", "user.model"}
DIFFER = {"search": {"reward"}, "retail": {"shaping"}}


def flat(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key != "extra_body":
            out.update(flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def training_settings(env: str) -> dict[str, Any]:
    return flat(yaml.safe_load((RECIPES / "env" / f"{env}.yaml").read_text()) or {})


def test_every_paper_dataset_reproduces_a_stage():
    """The budgets, stops and env settings come from the stage, so they cannot drift from training."""
    for dataset in load_stage_suite(RECIPES / "eval" / "paper.yaml").datasets:
        stage = read_stage(dataset.stage, dataset.env)
        assert (dataset.max_response_len, dataset.budget_mode, dataset.max_context_len, dataset.stop_token_ids) == (
            stage.max_response_len, stage.budget_mode, stage.max_context_len, stage.stop_token_ids
        ), dataset.name  # fmt: skip
    retail = next(d for d in load_stage_suite(RECIPES / "eval" / "paper.yaml").datasets if d.name == "retail")
    assert (retail.budget_mode, retail.max_context_len, retail.stop_token_ids) == ("per_turn", 32768, (151645,))


@pytest.mark.parametrize("dataset", [d for d in load_stage_suite(RECIPES / "eval" / "paper.yaml").datasets], ids=str)
def test_each_env_is_evaluated_with_its_training_settings(dataset):
    trained = {k: v for k, v in training_settings(dataset.env).items() if k not in SERVICES}
    evaluated = {k: v for k, v in flat(dataset.env_config).items() if k not in SERVICES}
    allowed = DIFFER.get(dataset.env, set())
    differing = {k for k in trained.keys() | evaluated.keys() if trained.get(k) != evaluated.get(k)}
    differing -= {k for k in differing if k.split(".")[0] in allowed}
    assert not differing, {k: (trained.get(k), evaluated.get(k)) for k in differing}


async def test_the_aime_eval_scores_a_response_as_training_does():
    """An unclosed thinking block holding \\boxed{5}: 1.0 under the training settings, 0.0 under the defaults."""
    aime26 = next(d for d in load_stage_suite(RECIPES / "eval" / "paper.yaml").datasets if d.name == "aime26")
    response = "<think>so the answer is \\boxed{5}"
    rewards = {}
    for name, config in (("defaults", {}), ("paper", dict(aime26.env_config))):
        env = MathEnvironment({**config, "workers": 1})
        try:
            episode = await env.start(Task("Find x.", "5"))
            prompts = episode.conversation.messages[0]["content"]
            await episode.step(response)
            rewards[name] = ((await episode.score()).reward, prompts.startswith("Solve the following math problem"))
        finally:
            await env.aclose()
    assert rewards == {"defaults": (0.0, False), "paper": (1.0, True)}


def test_mopd_evaluates_each_domain_with_its_own_settings_through_eval_config(tmp_path):
    """recipes/eval/mopd.yaml compiles into slime's --eval-config, written beside the custom config."""
    from aclarena_slime.recipes.compiler import compile_recipe
    from aclarena_slime.recipes.compose import load_recipe

    command = compile_recipe(load_recipe(RECIPES / "mopd.yaml", [f"paths.root={tmp_path}"]))
    argv = command.train_args
    path = Path(argv[argv.index("--eval-config") + 1])
    assert "--eval-prompt-data" not in argv and "--n-samples-per-eval-prompt" not in argv
    command.write_custom_config()
    written = {d["name"]: d for d in yaml.safe_load(path.read_text())["eval"]["datasets"]}
    math = written["math-aime2024"]
    assert (math["n_samples_per_eval_prompt"], math["temperature"], math["max_response_len"]) == (4, 0.6, 8192)
    assert (written["search-nq"]["temperature"], written["search-nq"]["max_response_len"]) == (1.0, 4096)
    assert (written["tau-retail"]["temperature"], written["tau-retail"]["max_response_len"]) == (0.7, 2048)
    assert {d["metadata_overrides"]["env"] for d in written.values()} == {"math", "search", "retail"}
