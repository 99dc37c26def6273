"""The forgetting monitor inside slime: the compiled section and slime's eval results drive the alarm, ``keep``
and ``stop`` (duck-typed ``args`` and results here, shaped as slime 624b824 hands them to
``--custom-eval-rollout-log-function-path``; against slime's own ``log_eval_rollout_data`` where slime is
importable)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from aclarena_slime.launcher.stage import StageResult, read_monitor_report
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.slime_edge import monitor as hook
from aclarena_slime.slime_edge import path as hook_path

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _compiled(tmp_path: Path, recipe: str = "mle_search.yaml", *overrides: str):
    suite = tmp_path / "watch.yaml"
    suite.write_text("name: watch\ndatasets:\n  gsm: {env: math, path: /data/math/gsm.jsonl}\n")
    settings = [
        "++monitor.enabled=true",
        "++monitor.domains=[math]",
        f"++monitor.suite={suite}",
        "++monitor.max_drop=5.0",
    ]
    return compile_recipe(load_recipe(RECIPES / recipe, [f"paths.root={tmp_path}", *settings, *overrides]))


def _eval(rewards: list[float]) -> dict:
    """slime's eval results (slime/rollout/sglang_rollout.py eval_rollout_single_dataset: rewards, truncated and
    the samples, which the alarm does not read), the stage's own set beside the watched one."""
    return {
        "gsm": {"rewards": rewards, "truncated": [False] * len(rewards)},
        "nq_test": {"rewards": [0.0], "truncated": [False]},
    }


def _adapter(folder: Path, seed: int) -> bytes:
    """A real PEFT adapter on the tiny model, as the disk sync writes it after a step; its weight bytes."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from aclarena_slime.local.tiny_model import save_tiny_checkpoint

    base = folder.parent / "tiny"
    if not (base / "config.json").is_file():
        save_tiny_checkpoint(base, with_model=True)
    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=2, target_modules=["q_proj"]))
    model.save_pretrained(folder)
    return (folder / "adapter_model.safetensors").read_bytes()


def test_the_compiled_stage_routes_slimes_eval_results_to_the_alarm(tmp_path: Path):
    command = _compiled(tmp_path, "mle_search.yaml", "++monitor.action=keep", "++monitor.interval=4")
    argv = command.train_args
    assert argv[argv.index("--custom-eval-rollout-log-function-path") + 1] == hook_path("monitor_eval_log")
    assert argv[argv.index("--eval-interval") + 1] == "4"
    section = command.custom_config["aclarena_monitor"]
    lora = command.custom_config["aclarena_lora"]
    assert section["policy_dir"] == f"{lora['sync_dir']}/{lora['adapter_name']}"  # what the disk sync rewrites
    assert section["datasets"] == {"gsm": "math"} and section["action"] == "keep"
    # the adapter being trained answers the watched domain's eval, as on the local backend
    assert command.custom_config["aclarena_experts"] == {"search": lora["adapter_name"], "math": lora["adapter_name"]}


@pytest.mark.slow  # a few real PEFT adapters on the tiny model
def test_keep_holds_the_adapter_of_the_last_check_before_the_fall(tmp_path: Path):
    section = _compiled(tmp_path, "mle_search.yaml", "++monitor.action=keep").custom_config["aclarena_monitor"]
    # slime's router address: the KL predictor's engine (these results carry no samples, so nothing is scored)
    args = SimpleNamespace(
        aclarena_monitor=section, skip_eval_before_train=False, sglang_router_ip="::1", sglang_router_port=1
    )
    policy = Path(section["policy_dir"])
    _adapter(policy, seed=0)
    assert hook.log_eval(0, args, _eval([1.0, 1.0, 0.0, 0.0]), None) is False  # the baseline, step 0: 50 points
    quiet = _adapter(policy, seed=1)  # the sync after rollout 0
    hook.log_eval(0, args, _eval([1.0, 1.0, 0.0, 0.0]), None)  # after rollout 0 trained: step 1, no fall
    _adapter(policy, seed=2)
    hook.log_eval(1, args, _eval([1.0, 0.0, 0.0, 0.0]), None)  # step 2: 25 points, a fall of 25 > 5
    report = json.loads((Path(section["out_dir"]) / "monitor.json").read_text())
    assert report["curves"]["math"] == [[0, 50.0], [1, 50.0], [2, 25.0]]
    (alarm,) = report["alarms"]
    assert (alarm["domain"], alarm["step"], alarm["kept_step"]) == ("math", 2, 1) and not report["stopped"]
    kept = Path(report["kept_adapter"])
    assert (kept / "adapter_model.safetensors").read_bytes() == quiet  # step 1's policy, not the fallen one


def test_stop_ends_the_job_at_the_fall_and_the_launcher_reports_a_stopped_stage(tmp_path: Path):
    section = _compiled(tmp_path, "stage2_search.yaml", "++monitor.action=stop").custom_config["aclarena_monitor"]
    assert section["policy_dir"] is None  # full fine-tuning: no adapter to keep, stop needs none
    args = SimpleNamespace(aclarena_monitor=section, skip_eval_before_train=False)
    hook.log_eval(0, args, _eval([1.0, 1.0]), None)
    with pytest.raises(hook.MonitorStop, match="math fell 50.0 points"):
        hook.log_eval(0, args, _eval([1.0, 0.0]), None)
    result = StageResult(1, "slime")  # the job ended with the raise
    read_monitor_report(result, section)
    assert result.status == 0 and "stopped by the forgetting monitor (math fell 50.0 points by rollout 1)" in (
        result.message or ""
    )
    assert result.metrics["monitor"]["stopped"] and result.metrics["monitor"]["backend"] == "slime"
    failed = StageResult(1, "slime")  # a job that failed for another reason stays failed
    read_monitor_report(failed, {**section, "out_dir": str(tmp_path / "elsewhere")})
    assert failed.status == 1


@pytest.mark.parametrize(
    ("recipe", "overrides", "match"),
    [
        ("stage2_search.yaml", ["++monitor.action=keep"], "trains no adapter"),
        ("mle_search.yaml", ["++monitor.action=keep", "lora.sync_mode=tensors"], "lora.sync_mode=disk"),
        ("mle_search.yaml", ["++monitor.suite=null"], "monitor.suite is required on the slime backend"),
        ("mle_search.yaml", ["+extra.eval_suite=eval/paper.yaml"], "set one of them"),
    ],
)
def test_what_slime_cannot_run_is_refused_when_it_compiles(tmp_path: Path, recipe, overrides, match):
    with pytest.raises(RecipeError, match=match):
        _compiled(tmp_path, recipe, *overrides)


def test_a_bad_monitor_setting_fails_when_the_recipe_composes(tmp_path: Path):
    with pytest.raises(RecipeError, match="monitor.action must be one of"):
        load_recipe(RECIPES / "stage1_math.yaml", [f"paths.root={tmp_path}", "++monitor.action=panic"])
    with pytest.raises(RecipeError, match="monitor.typo"):
        load_recipe(RECIPES / "stage1_math.yaml", [f"paths.root={tmp_path}", "+monitor.typo=1"])


@pytest.mark.slime
def test_slimes_own_eval_logging_calls_the_hook(tmp_path: Path):
    from slime.observability.rollout_metrics import log_eval_rollout_data

    section = _compiled(tmp_path, "stage2_search.yaml", "++monitor.action=stop").custom_config["aclarena_monitor"]
    args = SimpleNamespace(
        aclarena_monitor=section, skip_eval_before_train=False, log_passrate=False, use_wandb=False,
        use_tensorboard=False, wandb_always_use_train_step=False,
        custom_eval_rollout_log_function_path=hook_path("monitor_eval_log"),
    )  # fmt: skip
    logged = log_eval_rollout_data(0, args, _eval([1.0, 1.0]), None)  # the baseline: slime logs it as usual
    assert logged["eval/gsm"] == 1.0
    with pytest.raises(hook.MonitorStop):
        log_eval_rollout_data(0, args, _eval([0.0, 0.0]), None)
    assert json.loads((Path(section["out_dir"]) / "monitor.json").read_text())["stopped"]
