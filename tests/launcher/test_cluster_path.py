"""The cluster path a CPU run never takes: the Ray head's address, services other nodes reach, the
dashboard's bind address, the proxy bypass, and the flags a LoRA stage needs on a real cluster.

Issue 15, defects 1, 2, 3, 5 (compile side), 8 and 10 (compile side); each test here failed before its fix.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from aclarena_slime.launcher import ray_job
from aclarena_slime.launcher.backend import BackendChoice
from aclarena_slime.recipes import addresses
from aclarena_slime.recipes.addresses import AddressError
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import RecipeError, load_recipe
from aclarena_slime.recipes.flags import DEPRECATED_SGLANG_FLAGS, UnknownFlagError, known_flags

REPO = Path(__file__).resolve().parents[2]
# The colocated LoRA recipes (an asynchronous one is never colocated: tests/recipes/test_async.py).
MLE = sorted(p.stem for p in (REPO / "recipes").glob("mle_*.yaml") if not p.stem.endswith("_async"))
CLUSTERS = sorted(p.stem for p in (REPO / "recipes" / "cluster").glob("*.yaml"))
HEAD = "10.9.8.7"  # the routable fixture's address (conftest.py)



def load(name: str, tmp: Path, *overrides: str):
    return load_recipe(REPO / f"recipes/{name}.yaml", [f"paths.root={tmp}", *overrides])


# --- defect 1: the head's address -------------------------------------------------------------------------


def test_two_node_recipe_starts_the_head_on_a_routable_address(tmp_path: Path, routable, monkeypatch):
    monkeypatch.setattr(ray_job, "_ray", lambda: "ray")
    recipe = load("stage1_math", tmp_path)  # paper_2x8: 2 nodes
    assert addresses.nodes_needed(recipe.cluster) == 2
    assert recipe.cluster.ray.address == HEAD
    argv = ray_job.head_argv(recipe.cluster.ray, 8)
    assert f"--node-ip-address={HEAD}" in argv
    env = compile_recipe(recipe).runtime_env["env_vars"]
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"


def test_one_node_recipe_keeps_loopback_and_tells_ray_so(tmp_path: Path, routable):
    recipe = load("stage1_math", tmp_path, "cluster=single_8")
    assert recipe.cluster.ray.address == "127.0.0.1"
    # Without this Ray replaces 127.0.0.1 by the first interface's address (see the slime-marked test below).
    assert addresses.ray_cluster_env(recipe.cluster.ray.address) == {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def test_disaggregated_rollout_gpus_can_make_a_second_node(tmp_path: Path, routable):
    recipe = load("stage1_math", tmp_path, "cluster=single_8", "cluster.colocate=false", "cluster.rollout_num_gpus=8")
    assert addresses.nodes_needed(recipe.cluster) == 2 and recipe.cluster.ray.address == HEAD


def test_loopback_on_two_nodes_is_refused_with_the_fix(tmp_path: Path):
    with pytest.raises(RecipeError, match=r"loopback.*cluster\.ray\.address=HEAD_IP"):
        load("stage1_math", tmp_path, "cluster.ray.address=127.0.0.1")


def test_no_routable_address_refuses_the_launch_before_anything_starts(tmp_path: Path, monkeypatch, capsys):
    from aclarena_slime.launcher import services, stage

    monkeypatch.setattr(addresses, "routable_ip", lambda: None)
    recipe = load("stage2_search", tmp_path)  # loads (a dry run elsewhere must work) but has no head address
    assert recipe.cluster.ray.address is None
    assert "set cluster.ray.address=HEAD_IP" in stage.head_text(recipe)
    started = []
    monkeypatch.setattr(services, "start_service", lambda *a, **k: started.append(a))
    with pytest.raises(AddressError, match="cluster.ray.address=HEAD_IP"):
        stage.run_recipe(recipe, BackendChoice("slime", "test"))
    assert started == []


def test_join_refuses_loopback_and_takes_this_nodes_address(monkeypatch):
    monkeypatch.setattr(ray_job, "_ray", lambda: "ray")
    with pytest.raises(AddressError, match="head address"):
        ray_job.join_argv("127.0.0.1", 6379, 8, None)
    argv = ray_job.join_argv(HEAD, 6379, 8, "10.9.8.8")
    assert f"--address={HEAD}:6379" in argv and "--node-ip-address=10.9.8.8" in argv


def test_ensure_head_prints_the_address_and_starts_ray_with_it(tmp_path: Path, routable, monkeypatch, capsys):
    recipe = load("stage1_math", tmp_path)
    runs: list[tuple[list[str], dict[str, str]]] = []

    def run(argv, check=False, env=None, capture_output=False):
        runs.append((list(argv), dict(env or {})))
        return SimpleNamespace(returncode=1 if argv[1] == "status" else 0)  # no head yet; start succeeds

    monkeypatch.setattr(ray_job, "_ray", lambda: "ray")
    monkeypatch.setattr(ray_job.subprocess, "run", run)
    assert ray_job.ensure_head(recipe.cluster.ray, 8) is True
    start_argv, start_env = runs[-1]
    assert f"--node-ip-address={HEAD}" in start_argv and start_env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"
    out = capsys.readouterr().out
    assert f"[ray] head address: {HEAD}" in out and f"bash launch/join.sh {HEAD} --port 6379" in out


@pytest.mark.slime
@pytest.mark.parametrize("enabled", ["0", None])
def test_ray_keeps_a_loopback_head_only_with_the_env_we_set(enabled: str | None):
    """Ray's own resolution of ``ray start --node-ip-address`` (scripts.py -> resolve_ip_for_localhost)."""
    code = "from ray._private import services; print(services.resolve_ip_for_localhost('127.0.0.1'))"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    if enabled is not None:
        env.update(addresses.ray_cluster_env("127.0.0.1"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    node_ip = done.stdout.strip().splitlines()[-1]
    if enabled is not None:
        assert node_ip == "127.0.0.1"  # the address we print is the one slime's ranks get
    elif addresses.routable_ip() is not None:
        assert node_ip != "127.0.0.1"  # the swap this env var prevents


# --- defect 2: services on the head's address, no proxy in between ------------------------------------------


def test_services_listen_on_the_head_and_the_envs_get_that_url(tmp_path: Path, routable):
    recipe = load("mle_retail", tmp_path)
    command = compile_recipe(recipe)
    user = recipe.services["user_sim"]
    assert (user.host, user.url) == (HEAD, f"http://{HEAD}:30001")
    assert command.custom_config["aclarena_env_config"]["retail"]["user"]["base_url"] == f"http://{HEAD}:30001/v1"
    search = load("stage2_search", tmp_path, "cluster=single_8")
    assert search.services["retriever"].url == "http://127.0.0.1:8000"  # one node: loopback only


def test_job_bypasses_proxies_for_the_cluster(tmp_path: Path, routable, monkeypatch):
    monkeypatch.setenv("no_proxy", "corp.example")
    monkeypatch.delenv("NO_PROXY", raising=False)
    recipe = load("stage2_search", tmp_path, "cluster.no_proxy=[10.0.0.0/8]")
    env = compile_recipe(recipe).runtime_env["env_vars"]
    entries = env["no_proxy"].split(",")
    assert env["NO_PROXY"] == env["no_proxy"]
    assert {"corp.example", "localhost", "127.0.0.1", HEAD, "10.0.0.0/8"} <= set(entries)
    assert len(entries) == len(set(entries))


# --- defect 3: the dashboard and job API ------------------------------------------------------------------------


def test_dashboard_listens_on_the_head_address_only(tmp_path: Path, routable, monkeypatch):
    monkeypatch.setattr(ray_job, "_ray", lambda: "ray")
    for overrides in ((), ("cluster=single_8",)):
        ray = load("stage1_math", tmp_path, *overrides).cluster.ray
        argv = ray_job.head_argv(ray, 8)
        assert f"--dashboard-host={ray.address}" in argv
        assert not any("0.0.0.0" in arg for arg in argv)


# --- defect 5: LoRA colocated keeps SGLang's backbone ------------------------------------------------------------


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("name", MLE)
def test_colocated_lora_keeps_a_cpu_copy_of_sglangs_weights(name: str, cluster: str, tmp_path: Path, routable):
    recipe = load(name, tmp_path, f"cluster={cluster}")
    argv = compile_recipe(recipe).train_args
    assert recipe.lora.enabled and recipe.cluster.colocate
    assert "--sglang-enable-weights-cpu-backup" in argv and "--colocate" in argv
    assert "--sglang-enable-weights-cpu-backup" in known_flags()
    assert "--sequence-parallel" not in argv


@pytest.mark.parametrize("name", MLE)
def test_disaggregated_lora_and_full_finetuning_need_no_cpu_copy(name: str, tmp_path: Path, routable):
    split = load(name, tmp_path, "cluster.colocate=false", "cluster.rollout_num_gpus=8")
    assert "--sglang-enable-weights-cpu-backup" not in compile_recipe(split).train_args
    oracle = name.replace("mle_", "oracle_")
    if (REPO / "recipes" / f"{oracle}.yaml").exists():  # parallel MLE has no full fine-tuning counterpart
        full = load(oracle, tmp_path)
        assert "--sglang-enable-weights-cpu-backup" not in compile_recipe(full).train_args


# --- defect 8: a LoRA stage never loads HF weights into Megatron ------------------------------------------------------


def _hf_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_lora_stage_refuses_an_hf_load_with_the_fix(tmp_path: Path, routable):
    hf = _hf_folder(tmp_path / "Qwen3-8B")
    with pytest.raises(RecipeError, match=r"Hugging Face folder.*convert_hf_to_torch_dist"):
        compile_recipe(load("mle_math", tmp_path, f"checkpoint.load={hf}"))
    with pytest.raises(RecipeError, match="Hugging Face folder"):  # the HF checkpoint itself, even before it exists
        missing = tmp_path / "not-yet-converted"
        compile_recipe(load("mle_math", tmp_path, f"model.hf_checkpoint={missing}", f"checkpoint.load={missing}"))
    megatron = tmp_path / "torch_dist"
    megatron.mkdir()
    (megatron / "latest_checkpointed_iteration.txt").write_text("release")
    compile_recipe(load("mle_math", tmp_path, f"checkpoint.load={megatron}"))
    compile_recipe(load("stage1_math", tmp_path, f"checkpoint.load={hf}"))  # full fine-tuning may start from HF


# --- defect 10: no deprecated SGLang aliases -------------------------------------------------------------------------


@pytest.mark.parametrize("cluster", ["paper_2x8", "single_8"])
def test_cuda_graph_batch_sizes_use_the_current_flag(cluster: str, tmp_path: Path, routable):
    argv = compile_recipe(load("stage1_math", tmp_path, f"cluster={cluster}")).train_args
    assert "--sglang-cuda-graph-bs-decode" in argv
    assert not set(argv) & set(DEPRECATED_SGLANG_FLAGS)


def test_a_deprecated_sglang_alias_is_refused_with_its_replacement(tmp_path: Path, routable):
    recipe = load("stage1_math", tmp_path, "~cluster.sglang.cuda_graph_bs_decode", "+cluster.sglang.cuda_graph_bs=[1,2]")
    with pytest.raises(UnknownFlagError, match="deprecated SGLang alias; use --sglang-cuda-graph-bs-decode"):
        compile_recipe(recipe)
    for replacement in DEPRECATED_SGLANG_FLAGS.values():
        assert replacement.split()[0] in known_flags()


def test_service_probes_never_go_through_a_proxy(tmp_path: Path):
    """The launcher's readiness poll and the doctor's per-node probe talk to the head directly."""
    from aclarena_slime.launcher.services import start_service, stop_service

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    service = SimpleNamespace(
        command=[sys.executable, "-m", "http.server", "{port}", "--bind", "{host}"],
        host="127.0.0.1", port=port, ready_path="/", ready_timeout_s=30.0, url=f"http://127.0.0.1:{port}",
    )  # fmt: skip
    running = start_service("files", service, tmp_path, poll_s=0.1)
    code = (
        "import sys; from aclarena_slime.launcher.services import is_ready; "
        "from aclarena_slime.launcher.preflight_cluster import probe_url; "
        "print(is_ready(sys.argv[1]), probe_url(sys.argv[1]))"
    )
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "http_proxy")}
    env["http_proxy"] = "http://127.0.0.1:9"  # nothing listens there; urllib reads it when a process starts
    try:
        done = subprocess.run([sys.executable, "-c", code, service.url + "/"], env=env, capture_output=True, text=True, timeout=120)
    finally:
        stop_service(running)
    assert done.stdout.split() == ["True", "None"], done.stderr
