"""slime's own ``train.py`` in the loop on a CPU (``launch/stage.sh RECIPE --smoke``), per stage recipe.

Runs where slime (with SGLang's package and sglang-router) is importable; CI, without slime, skips it.
Asserts on the samples slime itself dumped (``--save-debug-rollout-data``), not on our own figures.
Each run takes a few minutes on two cores: a Ray head, slime's router, rollouts on the tiny model.
slime's argument parser needs Megatron-LM: at slime's image path (``paths.megatron``'s default), importable, or a
checkout named by the environment variable ``ACLARENA_MEGATRON`` (passed as ``paths.megatron``); without any of
them the smoke tests skip, saying so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aclarena_slime.launcher import smoke
from aclarena_slime.launcher.smoke_report import read_dumps, sample_problems

pytestmark = pytest.mark.slime

REPO = Path(__file__).resolve().parents[2]
MEGATRON_VAR = "ACLARENA_MEGATRON"  # a Megatron-LM checkout, where slime's image path has none


def megatron_overrides() -> list[str]:
    """``paths.megatron`` from ``ACLARENA_MEGATRON``; none where slime's image path or the interpreter has
    Megatron-LM; otherwise the test skips, naming the variable."""
    from aclarena_slime.recipes.schema import PathsConfig

    if os.environ.get(MEGATRON_VAR):
        return [f"paths.megatron={os.environ[MEGATRON_VAR]}"]
    image = Path(PathsConfig().megatron)
    try:
        importable = importlib.util.find_spec("megatron.training") is not None
    except (ImportError, ValueError):
        importable = False
    if not importable and not (image / "megatron" / "training").is_dir():
        pytest.skip(
            f"slime's argument parser needs Megatron-LM, not at slime's image path {image} nor importable here: "
            f"set {MEGATRON_VAR}=MEGATRON_LM_CHECKOUT"
        )
    return []


def run_smoke(recipe: str, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    if smoke.missing_slime():
        pytest.skip(smoke.missing_slime())
    done = subprocess.run(
        [sys.executable, "-m", "aclarena_slime.launcher.smoke", recipe, *megatron_overrides(), "--smoke",
         "--smoke-dir", str(out)],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=3000,
    )  # fmt: skip
    report_path = out / "report.json"
    assert report_path.is_file(), done.stderr[-4000:]
    return done, json.loads(report_path.read_text())


def check_dumped(out: Path, tag: str, with_eval: bool) -> dict[str, list[dict]]:
    from slime.utils.types import Sample

    from aclarena_slime.testing.samples import check_invariants

    dumps = read_dumps(out / "dumps")
    train = dumps["train"]
    assert len(train) == smoke.ROLLOUTS * smoke.PROMPTS * smoke.SAMPLES
    assert sorted(p.name for p in (out / "dumps").glob("[0-9]*.pt")) == [f"{i}.pt" for i in range(smoke.ROLLOUTS)]
    for sample in train + dumps["eval"]:
        assert sample["metadata"]["env"] == tag
        assert sample_problems(sample) == []
        check_invariants(Sample.from_dict(dict(sample)))  # slime's own Sample, rebuilt from its dump
        assert sample["status"] in ("completed", "truncated")
        assert isinstance(sample["reward"], float)
        assert sample["metadata"]["aclarena"]["turns"], "no model turn recorded"
    # One GRPO group per prompt: slime gave each its group index, n_samples_per_prompt samples each.
    groups = {}
    for sample in train:
        groups.setdefault(sample["group_index"], []).append(sample)
    assert sorted(len(g) for g in groups.values()) == [smoke.SAMPLES] * (smoke.ROLLOUTS * smoke.PROMPTS)
    if with_eval:
        # slime evaluates before training and after every rollout; it saves eval_{rollout_id}.pt, so the
        # eval before training and the one after rollout 0 share a file: one file per rollout id.
        assert len(dumps["eval"]) == smoke.ROLLOUTS * smoke.EVAL_PROMPTS
    return dumps


def check_report(done: subprocess.CompletedProcess, report: dict) -> None:
    assert done.returncode == 0, done.stderr[-4000:]
    assert report["ok"] and report["job_status"] == 0
    calls = report["engine_calls"]
    # What slime's external-engine mode and our rollout called on the engine.
    assert calls.get("GET /server_info", 0) >= 1 and calls.get("POST /generate", 0) >= 1
    assert report["post_process"]["problems"] == []
    assert report["still_running_after_stop"] == []  # engine, services, every Ray process: stopped by PID
    assert "smoke: OK" in done.stdout


def test_math_stage_with_its_eval(tmp_path):
    done, report = run_smoke("recipes/stage1_math.yaml", tmp_path / "math")
    check_report(done, report)
    dumps = check_dumped(tmp_path / "math", "math", with_eval=True)
    assert all(len(s["metadata"]["aclarena"]["turns"]) == 1 for s in dumps["train"])  # single-turn env
    assert "dynamic sampling off" in done.stderr  # the filter would loop forever on constant rewards


def test_search_stage_with_its_retriever(tmp_path):
    done, report = run_smoke("recipes/stage2_search.yaml", tmp_path / "search")
    check_report(done, report)
    dumps = check_dumped(tmp_path / "search", "search", with_eval=True)
    assert "[services] retriever: ready" in done.stdout + done.stderr
    # The env reached the retriever the smoke started: its log shows the queries that came in.
    retriever_log = (tmp_path / "search" / "retriever.log").read_text()
    searched = [s for s in dumps["train"] + dumps["eval"] if len(s["metadata"]["aclarena"]["turns"]) > 1]
    if searched:  # a tiny random model rarely writes a well-formed tool call; when it does, it was served
        assert "/retrieve" in retriever_log


def test_async_lora_stage_pins_episodes_to_the_served_version(tmp_path):
    """The versioned-adapter recipe in slime's rollout: the first sync serves retail@0 (the smoke does it,
    as slime skips syncs in rollout-only mode), and every sample records the version it ran on."""
    done, report = run_smoke("recipes/mle_retail_async.yaml", tmp_path / "async")
    check_report(done, report)
    assert "adapter retail@0 served" in done.stderr
    dumps = check_dumped(tmp_path / "async", "retail", with_eval=False)
    for sample in dumps["train"]:
        assert sample["metadata"]["aclarena"]["adapter"] == {"name": "retail@0", "version": 0, "staleness": 0}


@pytest.mark.parametrize("bootstrap", [False, True])
def test_slimes_train_actor_device_lookup_needs_the_bootstrap_on_a_cpu(bootstrap):
    """What slime's TrainRayActor.__init__ does: without a device it raises; the bootstrap gives a do-nothing one."""
    import os

    code = (
        "from slime.utils import accelerator\n"
        "print(accelerator.resolve_visible_device_id(0), accelerator.device_type(), accelerator.device_count())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MUSA_PATCH_PATH", "SLIME_ACCELERATOR")}
    if bootstrap:
        env["MUSA_PATCH_PATH"] = str(smoke.BOOTSTRAP)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if bootstrap:
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["0", "musa", "1"]
    else:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: slime finds a device without the bootstrap")
        assert done.returncode != 0 and "No usable accelerator" in done.stderr
