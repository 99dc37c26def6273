"""Issue 27, the cluster path's second read: the iteration an MLE stage loads, the export SGLang serves, one Ray head
for a curriculum, rollout 0, pipeline parallelism, the pre-flight that must not hang, and the cost of colocating
a stage without engines. Each test here failed before its fix."""

from __future__ import annotations

import argparse
import json
import socket
import struct
from pathlib import Path

import pytest
import yaml

from aclarena_slime.cli import CommandError, doctor
from aclarena_slime.curriculum import runner as curriculum_runner
from aclarena_slime.curriculum.runner import run_curriculum
from aclarena_slime.launcher import preflight, ray_job, stage
from aclarena_slime.launcher.backend import BackendChoice
from aclarena_slime.launcher.hf_export import ExportError, ensure_export, export_argv, vocab_mismatch
from aclarena_slime.launcher.preflight_cluster import cluster_checks
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.slime_edge import path as hook_path

REPO = Path(__file__).resolve().parents[2]


def load(name: str, tmp: Path, *overrides: str):
    return load_recipe(REPO / f"recipes/{name}.yaml", [f"paths.root={tmp}", *overrides])


def flag(argv: list[str], name: str) -> list[str] | None:
    if name not in argv:
        return None
    i = argv.index(name) + 1
    out = []
    while i < len(argv) and not argv[i].startswith("--"):
        out.append(argv[i])
        i += 1
    return out


# --- item 1: the iteration slime writes ---------------------------------------------------------------------


def test_doctor_checks_the_iteration_folder_exists(tmp_path: Path, routable):
    recipe = load("mle_search", tmp_path)
    (Path(recipe.checkpoint.load) / "iter_0000999").mkdir(parents=True)
    assert [c.status for c in preflight.check_iteration(recipe)] == ["ok"]
    recipe.checkpoint.ckpt_step = 1000  # what the recipes said before: never written
    (check,) = preflight.check_iteration(recipe)
    assert check.status == "fail" and "iter_0001000 does not exist (there: iter_0000999)" in check.detail


# --- item 2: the export SGLang serves ------------------------------------------------------------------------


def write_safetensors(folder: Path, rows: int, config_vocab: int, hidden: int = 4) -> None:
    """A safetensors file (the format's header, zero data) with embedding / head tensors of ``rows`` rows."""
    folder.mkdir(parents=True, exist_ok=True)
    size = rows * hidden * 2
    header = {
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [rows, hidden], "data_offsets": [0, size]},
        "lm_head.weight": {"dtype": "BF16", "shape": [rows, hidden], "data_offsets": [size, 2 * size]},
    }
    text = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(2 * size))
    (folder / "config.json").write_text(json.dumps({"vocab_size": config_vocab}))


def test_the_export_command_strips_megatrons_vocab_padding(tmp_path: Path, routable):
    recipe = load("mle_search", tmp_path)
    argv = export_argv(recipe, recipe.model.hf_checkpoint)
    assert flag(argv, "--vocab-size") == ["151936"]
    assert flag(argv, "--input-dir") == [f"{recipe.checkpoint.load}/iter_0000999"]


def test_a_padded_export_is_found_by_its_rows(tmp_path: Path):
    write_safetensors(tmp_path / "padded", rows=152064, config_vocab=151936)  # TP 2: padded to 128 x 2
    write_safetensors(tmp_path / "good", rows=151936, config_vocab=151936)
    assert "has 152064 rows, the config's vocab_size is 151936" in vocab_mismatch(tmp_path / "padded")
    assert vocab_mismatch(tmp_path / "good") is None


def test_the_launcher_makes_the_export_once_and_checks_it(tmp_path: Path, routable):
    recipe = load("mle_search", tmp_path, "model.architecture.vocab_size=16")
    (Path(recipe.checkpoint.load) / "iter_0000999").mkdir(parents=True)
    calls = []

    def converter(rows):  # slime's converter needs Megatron-LM: a stand-in writing what it would
        def run(argv, env):
            calls.append(argv)
            write_safetensors(Path(flag(argv, "--output-dir")[0]), rows=rows, config_vocab=16)
            return 0

        return run

    with pytest.raises(ExportError, match="has 128 rows"):
        ensure_export(recipe, converter(128))
    assert not Path(recipe.model.hf_checkpoint).exists()  # a bad export is never left where SGLang reads
    assert "exported" in ensure_export(recipe, converter(16))
    assert "match 16" in ensure_export(recipe, converter(16)) and len(calls) == 2  # made once
    assert [c.status for c in preflight.check_export(recipe)] == ["ok"]
    write_safetensors(Path(recipe.model.hf_checkpoint), rows=128, config_vocab=16)
    assert [c.status for c in preflight.check_export(recipe)] == ["fail"]


# --- item 3: one Ray head for a curriculum, and the GPUs it needs --------------------------------------------


FAKE_RAY = """#!/usr/bin/env bash
# The ray CLI's answers, logged: status answers 0 while a head is up; start --head brings one up, stop takes it down.
echo "$*" >> "{log}"
case "$1" in
  status) [ -f "{up}" ] ;;
  start) touch "{up}" ;;
  stop) rm -f "{up}" ;;
  job) exit 0 ;;
esac
"""


def test_a_curriculum_keeps_one_head_for_all_of_its_stages(tmp_path: Path, routable, monkeypatch):
    log, up = tmp_path / "ray.log", tmp_path / "head-up"
    script = tmp_path / "ray"
    script.write_text(FAKE_RAY.format(log=log, up=up))
    script.chmod(0o755)
    monkeypatch.setattr(ray_job, "_ray", lambda: str(script))
    monkeypatch.setattr(ray_job, "cluster_gpus", lambda ray: 16.0)  # both nodes joined
    curriculum = tmp_path / "two.yaml"
    stages = [{"name": "s1", "recipe": str(REPO / "recipes/stage1_math.yaml")},
              {"name": "s2", "recipe": str(REPO / "recipes/stage2_search.yaml")}]  # fmt: skip
    overrides = [f"paths.root={tmp_path}", "cluster=paper_2x8"]
    curriculum.write_text(yaml.safe_dump({"name": "two", "output_dir": str(tmp_path / "out"), "overrides": overrides,
                                          "stages": stages, "evaluation": {"command": []}}))  # fmt: skip

    def slime_runner(recipe):
        return stage._run_slime(recipe)

    # this machine has no slime: the curriculum decides as on a GPU node
    monkeypatch.setattr(curriculum_runner, "choose_backend", lambda requested: BackendChoice("slime", "a GPU node"))
    run_curriculum(curriculum, runner=slime_runner, evaluator=lambda *_: None)
    verbs = [line.split()[0] + (" --head" if "--head" in line else "") for line in log.read_text().splitlines()]
    # one head started before the first stage, reused by both, stopped once after the last
    assert verbs == ["status", "start --head", "status", "job", "status", "job", "stop"]


def test_a_launch_waits_briefly_then_names_the_missing_gpus(tmp_path: Path, routable):
    recipe = load("mle_search", tmp_path, "cluster=paper_2x8")
    want = ray_job.gpus_needed(recipe.cluster)
    assert want == 16
    with pytest.raises(ray_job.RayError, match="offers 8 GPUs, the recipe needs 16 \\(8 missing\\).*launch/join.sh"):
        ray_job.require_gpus(recipe.cluster.ray, want, count=lambda ray: 8.0, wait_s=0.0)
    joined = iter([8.0, 16.0])
    assert ray_job.require_gpus(recipe.cluster.ray, want, count=lambda ray: next(joined), sleep=lambda s: None) == 16


# --- item 4: rollout 0 ---------------------------------------------------------------------------------------


def test_a_stage_from_a_megatron_checkpoint_starts_at_rollout_0(tmp_path: Path, routable):
    """slime: start = loaded iteration + 1, and Megatron answers 0 under --finetune; a LoRA stage resumes instead
    (its loader answers -1 without an adapter checkpoint: tests/lora/test_checkpoint.py)."""
    for name in ("stage1_math", "stage2_search", "sdft_backbone"):
        assert flag(compile_recipe(load(name, tmp_path)).train_args, "--start-rollout-id") == ["0"], name
    assert flag(compile_recipe(load("mle_search", tmp_path)).train_args, "--start-rollout-id") is None


# --- item 5: the LoRA stage's data source ---------------------------------------------------------------------


def test_a_lora_stage_reads_its_own_data_position(tmp_path: Path, routable):
    argv = compile_recipe(load("mle_search", tmp_path)).train_args
    assert flag(argv, "--data-source-path") == [hook_path("resumable_data_source")]
    argv = compile_recipe(load("stage2_search", tmp_path)).train_args
    assert flag(argv, "--data-source-path") is None  # full fine-tuning: slime's own


# --- item 7: pipeline parallelism ------------------------------------------------------------------------------


def test_pipeline_parallelism_is_refused_at_compile_time_and_by_the_doctor(tmp_path: Path, routable):
    pp = "cluster.perf.pipeline_model_parallel_size=2"
    with pytest.raises(
        RecipeError, match="pipeline_model_parallel_size=2: a LoRA stage supports pipeline parallelism 1"
    ):
        compile_recipe(load("mle_search", tmp_path, pp))
    args = argparse.Namespace(recipe=str(REPO / "recipes/mle_search.yaml"), overrides=[f"paths.root={tmp_path}", pp],
                              no_cluster=True, json=False)  # fmt: skip
    with pytest.raises(CommandError, match="pipeline parallelism 1"):
        doctor.run(args)
    compile_recipe(load("stage2_search", tmp_path, pp))  # full fine-tuning: slime's own pipeline support


# --- the pre-flight: no head is said in seconds -----------------------------------------------------------------


def test_doctor_reports_no_head_without_entering_ray_init(tmp_path: Path, routable):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    recipe = load(
        "stage1_math", tmp_path, "cluster=single_8", "cluster.ray.address=127.0.0.1", f"cluster.ray.port={port}"
    )

    def connect():
        raise AssertionError("ray.init against no head retries for minutes: it must not be called")

    (check,) = cluster_checks(recipe, {}, connect)
    assert check.status == "fail" and check.detail.startswith(f"no Ray head at 127.0.0.1:{port} (")


# --- cost: no colocation without engines; pause modes that deadlock ----------------------------------------------


def test_an_sft_stage_is_not_colocated(tmp_path: Path, routable):
    argv = compile_recipe(load("sdft_backbone", tmp_path)).train_args
    assert "--debug-train-only" in argv and "--colocate" not in argv
    assert not [a for a in argv if a.startswith("--sglang-")]
    assert "--colocate" in compile_recipe(load("stage2_search", tmp_path)).train_args


def test_retract_is_refused_where_it_would_deadlock(tmp_path: Path, routable):
    with pytest.raises(RecipeError, match="pause_mode=retract: this stage samples from the adapter it syncs"):
        compile_recipe(load("mle_search", tmp_path, "++lora.pause_mode=retract"))


def test_doctor_gives_up_on_a_port_that_answers_but_never_connects(tmp_path: Path, routable):
    """Something other than a Ray head holds the port: ray.init would retry for minutes; the doctor says so."""
    import threading

    release = threading.Event()
    recipe = load("stage1_math", tmp_path, "cluster=single_8")

    def connect():  # stands in for ray.init retrying
        release.wait()

    try:
        (check,) = cluster_checks(recipe, {}, connect, probe=lambda host, port: None, connect_timeout_s=0.2)
    finally:
        release.set()
    assert check.status == "fail" and "did not connect within 0.2 s" in check.detail
