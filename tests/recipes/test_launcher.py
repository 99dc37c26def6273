"""launch/stage.sh: backend choice with a reason, dry run, overrides, services, the local mapping."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from aclarena_slime.launcher.backend import BackendUnavailable, choose_backend
from aclarena_slime.launcher.services import ServiceError, is_ready, start_service, stop_service
from aclarena_slime.launcher.stage import main
from aclarena_slime.local.session import open_session
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.recipes.flags import known_flags

REPO = Path(__file__).resolve().parents[2]


def test_backend_choice_says_why():
    assert choose_backend("auto", has_slime=True, gpus=8).name == "slime"
    local = choose_backend("auto", has_slime=False, gpus=0)
    assert local.name == "local" and "slime" in local.reason and "GPU" in local.reason
    assert "GPU" in choose_backend("auto", has_slime=True, gpus=0).reason
    assert choose_backend("local", has_slime=True, gpus=8).name == "local"
    # backend=local also comes from the local profile: the reason says what the machine has, not "requested"
    assert choose_backend("local", has_slime=True, gpus=0).reason == "no CUDA GPU here"
    assert choose_backend("local", has_slime=False, gpus=0).reason == "slime not importable, no CUDA GPU here"
    assert choose_backend("auto", has_slime=False, gpus=0).reason == "slime not importable, no CUDA GPU here"
    assert choose_backend("local", has_slime=True, gpus=8).reason.startswith("backend=local requested")
    with pytest.raises(BackendUnavailable, match="lacks a CUDA GPU"):
        choose_backend("slime", has_slime=True, gpus=0)


def test_stage_sh_dry_run_prints_the_full_command(tmp_path: Path):
    env = {**os.environ, "ACLARENA_PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(REPO / "launch" / "stage.sh"), "recipes/stage2_search.yaml", "--dry-run",
         f"paths.root={tmp_path}", "algorithm.lr=5e-6", "cluster.ray.address=10.1.2.3", "backend=slime"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "[stage] backend:" in done.stderr
    out = done.stdout
    assert "ray job submit" in out and "/train.py" in out
    assert "--custom-generate-function-path aclarena_slime.slime_edge.rollout.generate" in out
    assert "--lr 5e-06" in out
    assert "service retriever at http://10.1.2.3:8000" in out  # two nodes: on the head's address
    assert "# ray head address: 10.1.2.3 (2 nodes; on each other node: bash launch/join.sh 10.1.2.3" in out
    assert "--address=http://10.1.2.3:8265" in out
    command = out[out.index("ray job submit") :]
    flags = {token for token in command.replace("\\\n", " ").split() if token.startswith("--") and "=" not in token}
    assert flags - {"--"} <= known_flags()
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def test_unknown_key_fails_on_the_command_line(tmp_path: Path, capsys):
    assert main(["recipes/stage1_math.yaml", "--dry-run", f"paths.root={tmp_path}", "rollout.n_samples=3"]) == 2
    assert "n_samples" in capsys.readouterr().err


def test_backend_shorthand_selects_local(tmp_path: Path, capsys):
    assert main([str(REPO / "recipes/stage1_math.yaml"), "--dry-run", f"paths.root={tmp_path}", "backend=local"]) == 0
    captured = capsys.readouterr()
    assert f"backend: local ({choose_backend('local').reason})" in captured.err
    assert "# local plan: env math" in captured.out and "ray job submit" not in captured.out


def test_local_mapping_uses_the_recipe_and_cluster_local(tmp_path: Path):
    recipe = load_recipe(REPO / "recipes/mle_search.yaml", [f"paths.root={tmp_path}", "cluster=local"])
    session = open_session(recipe)
    search = yaml.safe_load((REPO / "recipes/env/local/search.yaml").read_text())  # the profile, then the env's own
    assert session.env == "search" and session.model.source == "tiny"
    assert session.loop.steps == search["rollout"]["num_rollout"]
    assert session.loop.sampling.prompts_per_step == search["rollout"]["rollout_batch_size"]
    lora = session.policy.lora
    assert (lora.rank, lora.alpha, session.policy.name) == (16, 32.0, "search")
    assert "q_proj" in lora.hf_target_modules()  # Megatron names translated for PEFT
    env_config = session.records.env_config
    assert env_config["max_turns"] == 5  # the recipe's env settings, under the local profile's (topk: 1)
    assert env_config["topk"] == 1
    assert session.paths.output_dir == tmp_path / "runs" / "mle_search" / "local"
    with pytest.raises(RecipeError, match="Key 'stepz' not in 'LocalBackendSettings'"):
        open_session(load_recipe(REPO / "recipes/stage1_math.yaml", ["cluster=local", "++cluster.local.stepz=3"]))
    with pytest.raises(RecipeError, match="RL stages and SFT warm starts"):
        open_session(load_recipe(REPO / "recipes/sdft_backbone.yaml", ["cluster=local"]))
    warm = open_session(
        load_recipe(REPO / "recipes/stage2_search_sft.yaml", ["cluster=local", f"paths.root={tmp_path}"])
    )
    assert warm.env == "search" and warm.paths.output_dir == tmp_path / "runs" / "stage2_search_sft" / "local"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_service_starts_waits_until_ready_and_stops(tmp_path: Path):
    port = _free_port()
    service = SimpleNamespace(
        command=[sys.executable, "-m", "http.server", "{port}", "--bind", "{host}"],
        host="127.0.0.1", port=port, ready_path="/", ready_timeout_s=30.0, url=f"http://127.0.0.1:{port}",
    )  # fmt: skip
    running = start_service("files", service, tmp_path / "logs", poll_s=0.1)
    try:
        assert running.process is not None and is_ready(service.url + "/")
        reused = start_service("files", service, tmp_path / "logs")
        assert reused.process is None  # something answers there already: reused, never ours to stop
        stop_service(reused)
        assert running.process.poll() is None
    finally:
        stop_service(running)
    assert running.process.poll() is not None
    assert not is_ready(service.url + "/", timeout_s=0.5)


def test_service_that_dies_is_reported_with_its_log(tmp_path: Path):
    service = SimpleNamespace(
        command=[sys.executable, "-c", "import sys; print('no corpus'); sys.exit(3)"],
        host="127.0.0.1", port=_free_port(), ready_path="/health", ready_timeout_s=30.0, url="http://127.0.0.1:1",
    )  # fmt: skip
    service.url = f"http://127.0.0.1:{service.port}"
    with pytest.raises(ServiceError, match="exited with status 3"):
        start_service("retriever", service, tmp_path, poll_s=0.05)
    assert "no corpus" in (tmp_path / "retriever.log").read_text()


@pytest.mark.parametrize("name", ["sdft_backbone", "mopd", "mle_retail", "oracle_math", "stage4_if"])
def test_dry_run_prints_every_recipe_kind_even_where_local_cannot_run_it(name: str, tmp_path: Path, capsys):
    assert main([str(REPO / f"recipes/{name}.yaml"), "--dry-run", f"paths.root={tmp_path}", "backend=local"]) == 0
    out = capsys.readouterr().out
    if name in ("sdft_backbone", "mopd"):  # the local backend refuses it, naming why, and shows the slime command
        assert "# the local backend cannot run this stage" in out and "ray job submit" in out and "/train.py" in out
    else:  # the local plan: phases and resolved settings, no slime command
        assert "# local plan:" in out and "# phases:" in out and "ray job submit" not in out


def test_local_settings_on_the_command_line_select_the_local_profile():
    from aclarena_slime.launcher.stage import normalise_overrides

    assert normalise_overrides(["cluster.local.steps=4", "backend=local"]) == [
        "cluster=local", "cluster.local.steps=4", "cluster.backend=local"
    ]  # fmt: skip
    assert normalise_overrides(["cluster=single_8", "cluster.local.steps=4"])[0] == "cluster=single_8"


def test_interrupt_while_waiting_for_readiness_stops_the_service(tmp_path: Path, monkeypatch):
    from aclarena_slime.launcher import services

    service = SimpleNamespace(
        command=[sys.executable, "-c", "import time; time.sleep(120)"],
        host="127.0.0.1", port=_free_port(), ready_path="/health", ready_timeout_s=60.0, url="http://127.0.0.1:1",
    )  # fmt: skip
    started = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    answers = iter([False])  # the "already running?" probe says no; the first readiness poll is interrupted

    def ready(url, timeout_s=2.0):
        answer = next(answers, None)
        if answer is None:
            raise KeyboardInterrupt
        return answer

    monkeypatch.setattr(services.subprocess, "Popen", popen)
    monkeypatch.setattr(services, "is_ready", ready)
    with pytest.raises(KeyboardInterrupt):
        services.start_service("retriever", service, tmp_path, poll_s=0.01)
    assert len(started) == 1 and started[0].poll() is not None  # stopped, not leaked


def _fake_slime_job(monkeypatch, write_adapter: bool) -> list[list[str]]:
    """ray_job as on a cluster: the job 'runs' and, like the LoRA updater with disk sync, may write the adapter."""
    from aclarena_slime.launcher import ray_job
    from aclarena_slime.lora.export import write_peft_dir

    submitted: list[list[str]] = []

    def submit(argv, submission=None):
        submitted.append(list(argv))
        custom = Path(argv[argv.index("--custom-config-path") + 1])
        lora = yaml.safe_load(custom.read_text())["aclarena_lora"]
        if write_adapter:
            write_peft_dir(Path(lora["sync_dir"]) / lora["adapter_name"], {}, {"peft_type": "LORA"})
        return 0

    monkeypatch.setattr(ray_job, "ensure_head", lambda ray, gpus: False)
    monkeypatch.setattr(ray_job, "require_gpus", lambda ray, want: want)  # every node joined
    monkeypatch.setattr(ray_job, "submit", submit)
    # the SDFT iteration's HF export exists (tests/launcher/test_cluster_lineage.py makes and checks one)
    monkeypatch.setattr("aclarena_slime.launcher.hf_export.ensure_export", lambda recipe: None)
    return submitted


@pytest.mark.parametrize("write_adapter", [True, False])
def test_slime_lora_stage_reports_the_synced_adapter_or_fails(tmp_path: Path, monkeypatch, write_adapter: bool):
    from aclarena_slime.launcher.backend import BackendChoice
    from aclarena_slime.launcher.stage import finished_text, run_recipe

    submitted = _fake_slime_job(monkeypatch, write_adapter)
    recipe = load_recipe(REPO / "recipes/mle_math.yaml", [f"paths.root={tmp_path}"])
    result = run_recipe(recipe, BackendChoice("slime", "test"))
    assert len(submitted) == 1
    expected = f"{recipe.checkpoint.save}/adapters/math"  # <sync_dir>/<adapter_name>, written after every step
    if write_adapter:
        assert (result.status, result.adapter, result.message) == (0, expected, None)
    else:
        assert result.status == 1 and result.adapter is None
        assert f"no adapter at {expected}" in finished_text(result)
    assert result.hf_checkpoint is None  # only the SDFT backbone exports HF weights


def test_slime_full_stage_reports_its_hf_export(tmp_path: Path, monkeypatch):
    from aclarena_slime.launcher.backend import BackendChoice
    from aclarena_slime.launcher.stage import run_recipe

    monkeypatch.setattr("aclarena_slime.launcher.ray_job.ensure_head", lambda ray, gpus: False)
    monkeypatch.setattr("aclarena_slime.launcher.ray_job.require_gpus", lambda ray, want: want)
    monkeypatch.setattr("aclarena_slime.launcher.ray_job.submit", lambda argv, submission=None: 0)
    recipe = load_recipe(REPO / "recipes/sdft_backbone.yaml", [f"paths.root={tmp_path}"])
    result = run_recipe(recipe, BackendChoice("slime", "test"))
    assert (result.status, result.adapter) == (0, None)
    assert result.hf_checkpoint == str(tmp_path / "runs" / "sdft_backbone" / "hf")


def test_a_sampled_local_evaluation_is_named_before_the_held_out_line(tmp_path: Path):
    """The last line stays ``held-out reward: ...``; the line above says how it was measured and gives the greedy
    reward of the same prompts."""
    from aclarena_slime.launcher.stage import StageResult, finished_text

    def reward(value: float, k: int) -> dict:
        how = {"temperature": 1.0, "top_p": 0.7} if k > 1 else {"temperature": 0.0, "top_p": 1.0}
        return {"n": 4 * k, "mean_reward": value, "excluded": 0, "prompts": 4, "samples_per_prompt": k, **how}

    metrics = {
        "eval_before": reward(0.0, 8), "eval_warm_start": reward(0.25, 8), "eval_after": reward(0.5, 8),
        "eval_greedy": {"before": reward(0.25, 1), "after": reward(0.75, 1)},
    }  # fmt: skip
    lines = finished_text(StageResult(0, "local", adapter=str(tmp_path), metrics=metrics)).splitlines()
    assert lines[-2:] == [
        "held-out prompts: 4, 8 sample(s) each at temperature 1, top-p 0.7 (greedy: warm start 0.250 -> trained 0.750)",
        "held-out reward: base 0.000 -> warm start 0.250 -> trained 0.500",
    ]
    del metrics["eval_greedy"]  # a greedy evaluation: nothing beside it, no line
    assert finished_text(StageResult(0, "local", adapter=str(tmp_path), metrics=metrics)).splitlines() == [
        lines[0], lines[-1]
    ]  # fmt: skip
