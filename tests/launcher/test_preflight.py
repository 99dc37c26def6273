"""``aclarena doctor`` / ``launch/stage.sh --preflight``: each check says ok or what is wrong and the fix."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aclarena_slime.launcher import preflight
from aclarena_slime.launcher.preflight import Check
from aclarena_slime.recipes.compiler import compile_recipe
from aclarena_slime.recipes.compose import load_recipe

REPO = Path(__file__).resolve().parents[2]


def load(name: str, tmp: Path, *overrides: str):
    return load_recipe(REPO / f"recipes/{name}.yaml", [f"paths.root={tmp}", *overrides])


def statuses(checks: list[Check]) -> dict[str, str]:
    return {check.name: check.status for check in checks}


def test_versions_missing_fails_other_version_warns():
    installed = {"slime": (False, None), "sglang": (True, "0.5.23"), "transformer_engine": (True, "2.16.1"),
                 "megatron.training": (True, None), "torch": (True, "2.11.0+cu129")}  # fmt: skip
    checks = preflight.check_versions(
        lambda dist, module: installed[module.split(".")[0] if module != "megatron.training" else module]
    )
    by_name = {c.name: c for c in checks}
    assert by_name["version slime"].status == "fail" and "repository" in by_name["version slime"].fix
    assert by_name["version SGLang"].status == "warn" and "0.5.15" in by_name["version SGLang"].detail
    assert statuses(checks)["version torch"] == statuses(checks)["version TransformerEngine"] == "ok"


def _parser(*flags: str) -> list[argparse.ArgumentParser]:
    parser = argparse.ArgumentParser()
    for flag in flags:
        parser.add_argument(flag)
    return [parser]


def test_flags_against_the_installed_parser():
    argv = ["--lr", "1e-6", "--sglang-cuda-graph-bs", "1", "2"]
    assert preflight.check_flags(argv[:2], lambda: _parser("--lr"))[0].status == "ok"
    unknown = preflight.check_flags(argv, lambda: _parser("--lr"))[0]
    assert unknown.status == "fail" and "--sglang-cuda-graph-bs" in unknown.detail
    deprecated = preflight.check_flags(argv, lambda: _parser("--lr", "--sglang-cuda-graph-bs"))[0]
    assert deprecated.status == "fail" and "--sglang-cuda-graph-bs-decode" in deprecated.fix

    def missing() -> list[argparse.ArgumentParser]:
        raise ModuleNotFoundError("No module named 'megatron.training'")

    typed = argparse.ArgumentParser()
    typed.add_argument("--lr", type=float)
    wrong = preflight.check_flags(["--lr", "fast"], lambda: [typed])[0]
    assert wrong.status == "fail" and "--lr" in wrong.detail

    absent = preflight.check_flags(argv, missing)[0]
    assert absent.status == "fail" and "not installed" in absent.detail


def test_hooks_import_by_their_dotted_path():
    argv = ["--custom-rm-path", "aclarena_slime.slime_edge.rollout.reward", "--rollout-function-path", "aclarena_slime.rollout.nope",
            "--custom-config-path", "/x.yaml"]  # fmt: skip
    checks = preflight.check_hooks(argv)
    assert statuses(checks) == {"hook --custom-rm-path": "ok", "hook --rollout-function-path": "fail"}


@pytest.mark.slime
def test_every_hook_of_every_recipe_loads_with_slimes_loader(tmp_path: Path, routable):
    from slime.utils.misc import load_function

    for name in ("stage1_math", "stage2_search", "mopd", "sdft_backbone"):
        argv = compile_recipe(load(name, tmp_path)).train_args
        for flag, path in preflight.hook_paths(argv):
            assert load_function(path) is preflight.load_hook(path), flag
        assert all(c.status == "ok" for c in preflight.check_hooks(argv)), name


def test_checkpoint_format(tmp_path: Path, routable):
    megatron = tmp_path / "torch_dist"
    megatron.mkdir()
    (megatron / "latest_checkpointed_iteration.txt").write_text("release")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    recipe = load("mle_math", tmp_path, f"checkpoint.load={megatron}")
    assert set(statuses(preflight.check_checkpoint(recipe)).values()) == {"ok"}
    recipe.checkpoint.load = str(hf)  # as it would be on disk after someone swapped the folder
    bad = {c.name: c for c in preflight.check_checkpoint(recipe)}["checkpoint.load"]
    assert bad.status == "fail" and "convert_hf_to_torch_dist" in bad.fix
    assert statuses(preflight.check_checkpoint(load("mle_math", tmp_path)))["checkpoint.load"] == "fail"  # missing
    full = load("stage1_math", tmp_path, f"checkpoint.load={hf}")  # ref_load follows load
    assert set(statuses(preflight.check_checkpoint(full)).values()) == {"ok"}


def test_tokenizer_loads(tmp_path: Path, tiny_checkpoint: Path, routable):
    assert (
        preflight.check_tokenizer(load("stage1_math", tmp_path, f"model.hf_checkpoint={tiny_checkpoint}"))[0].status
        == "ok"
    )
    assert preflight.check_tokenizer(load("stage1_math", tmp_path))[0].status == "fail"


def test_data_goes_through_the_envs_start(tmp_path: Path, routable):
    from aclarena_slime.plugin.registry import load_factory

    records = load_factory("math")({}).demo_records(4)
    train = tmp_path / "data" / "math" / "train.jsonl"
    train.parent.mkdir(parents=True)
    train.write_text("".join(json.dumps(r) + "\n" for r in records))
    recipe = load("stage1_math", tmp_path)
    for path in recipe.data.eval_prompt_data.values():  # the stage's eval sets (the authors' AIME years)
        Path(path).write_text(train.read_text())
    assert set(statuses(preflight.check_data(recipe)).values()) == {"ok"}
    records[0]["metadata"]["env"] = "search"  # a record of another env in this stage's data
    train.write_text("".join(json.dumps(r) + "\n" for r in records))
    bad = {c.name: c for c in preflight.check_data(recipe)}["data through env.start"]
    assert bad.status == "fail" and "metadata.env" in bad.detail
    train.unlink()
    assert statuses(preflight.check_data(recipe))["data.prompt_data"] == "fail"


def test_every_records_label_goes_through_the_envs_check_label(tmp_path: Path, routable, monkeypatch):
    """A bad label past the records the doctor starts was found only when its record was drawn, mid-run."""
    from aclarena_slime.plugin.registry import load_factory

    factory = load_factory("math")
    records = factory({}).demo_records(6)
    records[4]["label"] = "oops"
    train = tmp_path / "data" / "math" / "train.jsonl"
    train.parent.mkdir(parents=True)
    train.write_text("".join(json.dumps(r) + "\n" for r in records))
    recipe = load("stage1_math", tmp_path)

    def check_label(self, label):
        if label == "oops":
            raise ValueError("not an answer")

    monkeypatch.setattr(factory, "check_label", check_label)
    bad = {c.name: c for c in preflight.check_data(recipe)}["data through env.start"]
    assert bad.status == "fail" and f"{train}:5: bad label for env 'math': not an answer" in bad.detail


def test_the_data_check_builds_the_env_through_the_registry(tmp_path: Path, routable, monkeypatch):
    """As every caller does (registry.get_environment): a plugin whose factory builds no Environment is named."""
    from aclarena_slime.plugin import registry

    train = tmp_path / "data" / "math" / "train.jsonl"
    train.parent.mkdir(parents=True)
    train.write_text("".join(json.dumps(r) + "\n" for r in registry.get_environment("math").demo_records(2)))
    recipe = load("stage1_math", tmp_path)
    monkeypatch.setitem(registry._registered, "math", lambda config: object())
    bad = {c.name: c for c in preflight.check_data(recipe)}["data through env.start"]
    assert bad.status == "fail" and "not an aclarena_slime.plugin.contract.Environment" in bad.detail


def test_lora_combinations(tmp_path: Path, routable):
    recipe = load("mle_math", tmp_path)
    argv = compile_recipe(recipe).train_args
    assert set(statuses(preflight.check_lora(recipe, argv)).values()) == {"ok"}
    stripped = [a for a in argv if a != "--sglang-enable-weights-cpu-backup"] + ["--sequence-parallel"]
    assert statuses(preflight.check_lora(recipe, stripped)) == {
        "lora colocate": "fail", "lora sequence parallel": "fail", "lora recompute": "ok"
    }  # fmt: skip


def test_loopback_head_on_two_nodes_fails(tmp_path: Path, routable):
    recipe = load("stage1_math", tmp_path)
    assert preflight.check_addresses(recipe)[0].status == "ok"
    recipe.cluster.ray.address = "127.0.0.1"
    assert preflight.check_addresses(recipe)[0].status == "fail"


def test_no_ray_head_is_a_failure_with_the_fix(tmp_path: Path, routable):
    from aclarena_slime.launcher.preflight_cluster import cluster_checks

    def connect():
        raise ConnectionError("nothing at 10.9.8.7:6379")

    check = cluster_checks(load("stage1_math", tmp_path), {}, connect)[0]
    assert check.status == "fail" and "ray start --head --node-ip-address=10.9.8.7" in check.fix


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slime
def test_cluster_checks_on_a_real_local_ray(tmp_path: Path):
    """A one-node Ray cluster with 8 logical GPUs: nodes, GPUs, a live and a dead service, the sync folder."""
    import ray

    from aclarena_slime.launcher.preflight_cluster import cluster_checks

    live, dead = _free_port(), _free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(live), "--bind", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    recipe = load(
        "mle_retail", tmp_path, "cluster=single_8",
        f"services.user_sim.port={dead}", "+service@services.files=retriever", f"services.files.port={live}",
        "services.files.ready_path=/",
    )  # fmt: skip
    ray.init(num_cpus=1, num_gpus=8, include_dashboard=False, log_to_driver=False)
    no_probe = lambda host, port: None  # noqa: E731 - this head is in-process, not at the recipe's address
    try:
        from aclarena_slime.launcher.preflight_cluster import probe_url

        while probe_url(f"http://127.0.0.1:{live}/", 1.0) is not None:
            pass  # the file server is still starting
        checks = {c.name: c for c in cluster_checks(recipe, compile_recipe(recipe).runtime_env, lambda: ray, no_probe)}
        recipe.lora.sync_dir = str(tmp_path / "file" / "sub")
        (tmp_path / "file").write_text("not a folder")
        unwritable = cluster_checks(recipe, {}, lambda: ray, no_probe)
    finally:
        ray.shutdown()
        server.terminate()
        server.wait()
    assert checks["ray nodes"].status == checks["ray GPUs"].status == "ok"
    assert checks["service files"].status == "ok"
    assert checks["service user_sim"].status == "fail" and str(dead) in checks["service user_sim"].detail
    assert checks["lora sync_dir"].status == "ok" and "1 node" in checks["lora sync_dir"].detail
    assert {c.name: c.status for c in unwritable}["lora sync_dir"] == "fail"


def test_doctor_runs_here_and_names_what_this_machine_lacks(tmp_path: Path, routable, capsys):
    from aclarena_slime.cli import main

    assert main(["doctor", "recipes/mle_math.yaml", f"paths.root={tmp_path}", "--no-cluster", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["ok"] is False
    for part in ("slime", "SGLang", "Megatron-LM", "TransformerEngine"):
        if checks[f"version {part}"]["status"] == "fail":
            assert "not installed" in checks[f"version {part}"]["detail"] and checks[f"version {part}"]["fix"]
    assert checks["lora colocate"]["status"] == "ok"


def test_stage_sh_preflight_runs_the_doctor(tmp_path: Path):
    env = {**os.environ, "ACLARENA_PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "launch/stage.sh", "recipes/stage1_math.yaml", "--preflight", f"paths.root={tmp_path}",
         "cluster=single_8", "--no-cluster"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "[fail] data.prompt_data" in done.stdout and "checks:" in done.stdout
    assert not (tmp_path / "runs").exists()  # a pre-flight starts nothing and writes nothing


def test_slime_and_megatron_checkouts(tmp_path: Path, routable):
    slime, megatron = tmp_path / "slime", tmp_path / "Megatron-LM"
    recipe = load("stage1_math", tmp_path, f"paths.slime={slime}", f"paths.megatron={megatron}")
    missing = {c.name: c for c in preflight.check_paths(recipe)}
    assert missing["paths.slime"].status == "fail" and "train.py" in missing["paths.slime"].detail
    (megatron / "megatron" / "training").mkdir(parents=True)
    slime.mkdir()
    (slime / "train.py").write_text("")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(slime)], check=True)
    subprocess.run([*git, "-C", str(slime), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    checks = {c.name: c for c in preflight.check_paths(recipe)}
    assert checks["paths.megatron"].status == "ok" and "commit unknown" in checks["paths.megatron"].detail
    assert checks["paths.slime"].status == "warn" and "624b824" in checks["paths.slime"].detail
