"""``launch/stage.sh RECIPE --smoke`` without slime: how the recipe is shrunk, the bootstrap files, the report.

The run itself (slime's train.py) is in ``test_smoke_slime.py``, marked ``slime``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from aclarena_slime.evaluation.suite import HELD_OUT_SEED
from aclarena_slime.jsonl import iter_jsonl
from aclarena_slime.launcher import smoke
from aclarena_slime.launcher.smoke_report import phase_figures, report_text, sample_problems
from aclarena_slime.plugin.registry import get_environment
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import load_recipe

REPO = Path(__file__).resolve().parents[2]


def shrunk(recipe: str, tmp_path: Path, eval_data: bool = True) -> tuple[list[str], list[str]]:
    command = compile_recipe(load_recipe(REPO / recipe))
    data = (tmp_path / "train.jsonl", tmp_path / "eval.jsonl" if eval_data else None)
    return smoke.smoke_argv(command, model_dir=tmp_path / "model", data=data, engine="127.0.0.1:1234",
                            dump=tmp_path / "dumps", custom_config=tmp_path / "c.yaml")  # fmt: skip


def values(argv: list[str], flag: str) -> list[str] | None:
    return smoke._flag_values(argv, flag)


def test_edit_flags_drops_flags_with_their_values_and_sets_others():
    argv = ["--a", "1", "2", "--b", "--c", "x"]
    assert smoke.edit_flags(argv, {"--a"}, {"--c": ["y"], "--d": None}) == ["--b", "--c", "y", "--d"]


def test_math_recipe_is_shrunk_to_a_rollout_only_run_and_says_what_it_turned_off(tmp_path):
    argv, notes = shrunk("recipes/stage1_math.yaml", tmp_path)
    for flag in ("--dynamic-sampling-filter-path", "--over-sampling-batch-size", "--use-kl-loss", "--kl-loss-coef",
                 "--load", "--ref-load", "--save", "--colocate"):  # fmt: skip
        assert flag not in argv, flag
    assert "--debug-rollout-only" in argv
    assert values(argv, "--rollout-external-engine-addrs") == ["127.0.0.1:1234"]
    assert values(argv, "--save-debug-rollout-data") == [str(tmp_path / "dumps" / "{rollout_id}.pt")]
    assert values(argv, "--num-rollout") == [str(smoke.ROLLOUTS)]
    assert values(argv, "--rollout-batch-size") == [str(smoke.PROMPTS)]
    assert values(argv, "--n-samples-per-prompt") == [str(smoke.SAMPLES)]
    name, path = values(argv, "--eval-prompt-data")  # one eval set, the recipe's first, on the smoke's records
    assert name == next(iter(load_recipe(REPO / "recipes/stage1_math.yaml", []).data.eval_prompt_data))
    assert path == str(tmp_path / "eval.jsonl")
    assert values(argv, "--eval-interval") == ["1"]
    assert values(argv, "--hf-checkpoint") == [str(tmp_path / "model")]
    # Our hooks stay exactly as the recipe sets them: they are what the smoke is for.
    assert values(argv, "--custom-generate-function-path") == ["aclarena_slime.slime_edge.rollout.generate"]
    assert values(argv, "--custom-reward-post-process-path") == [
        "aclarena_slime.slime_edge.rollout.reward_post_process"
    ]
    assert any("dynamic sampling off" in n for n in notes) and any("KL" in n for n in notes)
    assert len(argv) == len(set(a for a in argv if a.startswith("--"))) + sum(1 for a in argv if not a.startswith("--"))


def test_without_eval_data_the_eval_flags_go(tmp_path):
    argv, notes = shrunk("recipes/stage1_math.yaml", tmp_path, eval_data=False)
    assert "--eval-prompt-data" not in argv and "--eval-interval" not in argv
    assert any("no eval" in n for n in notes)


def test_the_demo_data_is_evaluated_on_the_held_out_seeds_prompts(tmp_path):
    """Without --smoke-data the eval records are the demo records every evaluation holds out
    (evaluation.suite.HELD_OUT_SEED), not a second copy of that seed."""
    recipe = SimpleNamespace(data=SimpleNamespace(env="math"))
    settings = smoke.SmokeSettings("recipe.yaml", [])
    _, evaluation = smoke._data(settings, recipe, {}, tmp_path)  # type: ignore[arg-type]
    held_out = get_environment("math").demo_records(smoke.EVAL_PROMPTS, seed=HELD_OUT_SEED)
    assert [r["prompt"] for _, r in iter_jsonl(evaluation)] == [r["prompt"] for r in held_out]


def test_a_service_reading_the_data_folder_gets_demo_data_and_a_free_port():
    recipe = load_recipe(REPO / "recipes/stage2_search.yaml")
    service = recipe.services["retriever"]
    roots = (recipe.paths.data, recipe.paths.models)
    demo = smoke.service_for_smoke(service, roots, demo=True, port=4321)
    assert "--corpus" not in demo.command and demo.command[-1] == "--demo"
    # the paper's E5 retriever reads an encoder and an index too: the demo retriever needs neither
    assert "--e5-model" not in demo.command and "--dense-index" not in demo.command
    assert not any(part.startswith(roots) for part in demo.command)
    assert demo.url == "http://127.0.0.1:4321" and "{port}" in demo.command
    kept = smoke.service_for_smoke(service, roots, demo=False, port=4321)
    assert "--corpus" in kept.command and "--demo" not in kept.command
    # watched as on a cluster, with the retriever's thread caps
    assert demo.env == {"OMP_NUM_THREADS": "32", "OPENBLAS_NUM_THREADS": "32", "MKL_NUM_THREADS": "32"}
    assert demo.max_restarts == service.max_restarts and demo.check_interval_s <= service.check_interval_s
    config = compile_recipe(recipe).custom_config
    moved = smoke.rebind_urls(config, {service.url: demo.url})
    assert moved["aclarena_env_config"]["search"]["retriever_url"] == "http://127.0.0.1:4321/retrieve"


@pytest.mark.skipif(smoke.missing_slime() is None, reason="slime is importable here: the smoke would run")
def test_without_slime_the_smoke_says_so_and_exits_non_zero(tmp_path):
    env = {**os.environ, "ACLARENA_PYTHON": sys.executable}
    done = subprocess.run(["bash", str(REPO / "launch/stage.sh"), "recipes/stage1_math.yaml", "--smoke"],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 2
    assert "cannot import slime" in done.stderr and "ACLARENA_PYTHON" in done.stderr


def test_the_torchvision_stand_in_imports_and_refuses_work():
    code = (
        "import torchvision\n"
        "from torchvision.io import decode_jpeg\n"
        "from torchvision.transforms import InterpolationMode\n"
        "from torchvision.transforms.v2 import functional as F\n"
        "from torchvision.transforms.functional import pil_to_tensor\n"
        f"assert torchvision.__file__.startswith({str(smoke.STANDINS)!r}), torchvision.__file__\n"
        "assert InterpolationMode.BILINEAR.value == 'bilinear'\n"
        "try:\n    decode_jpeg(b'')\nexcept RuntimeError as e:\n    print('refused:', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(smoke.STANDINS)},
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "refused: torchvision is an import-only stand-in" in done.stdout


def test_the_bootstrap_gives_torch_a_do_nothing_device():
    code = (
        f"import sys, torch; sys.path.append({str(smoke.BOOTSTRAP)!r})\n"
        "import musa_patch\n"
        "m = torch.musa\n"
        "assert m.is_available() and m.device_count() == 1 and m.current_device() == 0\n"
        "m.set_device(0); m.synchronize(); m.empty_cache()\n"
        "assert m.mem_get_info() == (0, 0) and m.memory_allocated() == 0\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def good_sample(index: int, env: str = "math", reward: float = 1.0) -> dict:
    return {
        "index": index, "tokens": [1, 2, 3, 4, 5], "response_length": 3, "loss_mask": [1, 0, 1],
        "rollout_log_probs": [-0.5, 0.0, -1.0], "status": "completed", "reward": reward,
        "metadata": {"env": env, "aclarena": {"turns": ["a", "b"], "end": "done"}},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"loss_mask": [1, 1]}, "loss_mask length"),
        ({"rollout_log_probs": [-1.0]}, "rollout_log_probs length"),
        ({"tokens": [1, 2, 3]}, "no prompt"),
        ({"loss_mask": [1, 2, 1]}, "0/1"),
        ({"rollout_log_probs": [-0.5, 0.0, math.nan]}, "not finite"),
        ({"rollout_log_probs": [0.5, 0.0, -1.0]}, "> 0"),
        ({"response_length": None}, "response_length"),
    ],
)
def test_broken_samples_are_named(change, words):
    assert sample_problems(good_sample(0)) == []
    problems = sample_problems({**good_sample(0), **change})
    assert problems and words in problems[0]


def test_the_report_groups_by_env_and_fails_on_a_violation():
    samples = [good_sample(0), good_sample(1, reward=0.0), good_sample(2, env="search", reward=0.5)]
    samples.append({**good_sample(3, env="search"), "loss_mask": [1]})
    figures = phase_figures(samples)
    assert figures["math"]["samples"] == 2 and figures["math"]["mean_reward"] == 0.5
    assert figures["math"]["statuses"] == {"completed": 2} and figures["math"]["turns_mean"] == 2.0
    assert figures["math"]["invariant_violations"] == [] and len(figures["search"]["invariant_violations"]) == 1
    report = {
        "job_status": 0, "seconds": 1.0, "settings": {"rollouts": 2, "prompts": 2, "samples": 2},
        "phases": {"train": figures, "eval": {}}, "errors_logged": [], "engine_calls": {"POST /generate": 4},
        "ok": False,
    }  # fmt: skip
    text = report_text(report)
    assert "train search" in text and "1 VIOLATED" in text and "POST /generate x4" in text
    assert "eval: no samples dumped" in text and text.endswith("smoke: FAILED")
    assert "everything started was stopped" in text
    assert "STILL RUNNING after stop: [123]" in report_text({**report, "still_running_after_stop": [123]})


def test_the_job_stays_on_the_loopback_head_whatever_the_cluster_profile_says():
    """paper_2x8's runtime env names the routable head and lets Ray swap loopback for it; the smoke's head is
    on 127.0.0.1, so the job's driver must keep that address (it timed out on 192.0.2.x before this)."""
    recipe_env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "no_proxy": "localhost,127.0.0.1,192.0.2.2",
                  "NO_PROXY": "localhost,127.0.0.1,192.0.2.2", "PYTHONPATH": str(REPO)}  # fmt: skip
    env = smoke.job_env(recipe_env)
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert env["no_proxy"] == env["NO_PROXY"] == "localhost,127.0.0.1"
    assert env["MUSA_PATCH_PATH"] and str(REPO) in env["PYTHONPATH"].split(":")


def test_an_llm_service_is_answered_by_the_smokes_engine_under_its_served_name(tmp_path):
    """The retail user simulator is an SGLang server of a model a CPU does not have: the smoke's local
    engine (same OpenAI API) takes its place under the name the env asks for; the retriever still runs."""
    recipe = load_recipe(REPO / "recipes" / "stage3_retail.yaml", [f"paths.root={tmp_path}"])
    assert smoke.served_llm(recipe.services["user_sim"]) == "user_sim"
    assert recipe.env_config["retail"]["user"]["model"] == "user_sim"
    search = load_recipe(REPO / "recipes" / "stage2_search.yaml", [f"paths.root={tmp_path}"])
    assert smoke.served_llm(search.services["retriever"]) is None
