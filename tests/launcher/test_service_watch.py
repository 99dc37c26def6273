"""The launcher watches a stage's services for the whole job (issue 44, section 1).

Real services on loopback: ``aclarena serve-retriever`` over a tiny corpus, and the local engine standing in
for the user simulator (as ``--smoke`` does). The Ray CLI is a stand-in script on PATH that behaves as
``ray job submit`` / ``ray job stop`` do for the launcher: submit blocks until the job ends (here: until it
is stopped, else it "succeeds" after a minute), stop ends the job with that submission id.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from aclarena_slime.launcher import ray_job, services
from aclarena_slime.launcher.stage import submit_watched
from aclarena_slime.recipes.schema import ServiceConfig

FAKE_RAY = """#!{python}
import os, pathlib, sys, time
state = pathlib.Path(os.environ["FAKE_RAY_STATE"])
args = sys.argv[1:]
with open(state / "calls.log", "a") as log:
    log.write(" ".join(args) + "\\n")
if args[:2] == ["job", "submit"]:
    sid = next((a.split("=", 1)[1] for a in args if a.startswith("--submission-id=")), "raysubmit_generated")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (state / ("stopped-" + sid)).exists():
            print("Job '" + sid + "' was stopped")
            sys.exit(1)
        time.sleep(0.05)
    print("Job '" + sid + "' succeeded")
    sys.exit(0)
if args[:2] == ["job", "stop"]:
    (state / ("stopped-" + args[-1])).touch()
    sys.exit(0)
sys.exit(0 if args[:1] == ["status"] else 2)  # a head answers: the launch reuses it
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def fake_ray(tmp_path: Path, monkeypatch) -> Path:
    bin_dir, state = tmp_path / "bin", tmp_path / "ray-state"
    bin_dir.mkdir()
    state.mkdir()
    script = bin_dir / "ray"
    script.write_text(FAKE_RAY.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_RAY_STATE", str(state))
    return state


def _retriever(tmp_path: Path, **watch) -> ServiceConfig:
    from aclarena_envs.search.demo_corpus import generate, write_jsonl

    corpus = write_jsonl(generate(20, seed=1).passages, tmp_path / "corpus.jsonl")
    port = _free_port()
    return ServiceConfig(
        command=["{python}", "-m", "aclarena_slime", "serve-retriever", "--corpus", str(corpus),
                 "--host", "{host}", "--port", "{port}"],
        host="127.0.0.1", port=port, ready_path="/health", ready_timeout_s=60.0, url=f"http://127.0.0.1:{port}",
        env={"OMP_NUM_THREADS": "32", "OPENBLAS_NUM_THREADS": "32", "MKL_NUM_THREADS": "32"},
        check_interval_s=0.2, unready_timeout_s=2.0, **watch,
    )  # fmt: skip


def _kill_when_ready(running: services.RunningService) -> None:
    assert running.process is not None
    os.killpg(running.process.pid, signal.SIGKILL)
    running.process.wait(timeout=10)


def test_a_retriever_killed_mid_job_stops_the_job_naming_it(tmp_path: Path, fake_ray: Path):
    """Today a dead retriever lets the job run to 'success' on aborted episodes; now the job is stopped."""
    running = [services.start_service("retriever", _retriever(tmp_path, max_restarts=0), tmp_path / "logs", 0.1)]
    try:
        _kill_when_ready(running[0])
        started = time.monotonic()
        status, stopped = submit_watched(["ray", "job", "submit", "--", "python", "train.py"],
                                         "http://127.0.0.1:8265", "stage2_search", running)  # fmt: skip
        took = time.monotonic() - started
    finally:
        for one in running:
            services.stop_service(one)
    assert status != 0 and stopped is not None
    assert took < 30, f"the job ran {took:.0f}s after its retriever died"
    assert stopped.startswith("service retriever exited with status -9 after 0 restart(s)")
    assert "services.retriever.max_restarts" in stopped and "aclarena retriever listening on" in stopped
    calls = (fake_ray / "calls.log").read_text().splitlines()
    [submit] = [c for c in calls if c.startswith("job submit")]
    sid = submit.split("--submission-id=", 1)[1].split()[0]
    assert sid.startswith("aclarena-stage2_search-")
    assert f"job stop --address=http://127.0.0.1:8265 {sid}" in calls


def test_a_dead_retriever_is_restarted_within_its_budget_and_the_job_goes_on(tmp_path: Path, fake_ray: Path):
    service = _retriever(tmp_path, max_restarts=1)
    running = [services.start_service("retriever", service, tmp_path / "logs", 0.1)]
    first = running[0].process
    watch = services.ServiceWatch(running, on_failure=lambda why: pytest.fail(f"stopped: {why}"))
    try:
        _kill_when_ready(running[0])
        assert watch.check() is None
        assert watch.restarts == {"retriever": 1}
        assert running[0].process is not first and running[0].process.poll() is None
        assert services.is_ready(service.url + "/health")
        _kill_when_ready(running[0])  # a second death is past the budget of one restart
        failure = watch.check()
    finally:
        for one in running:
            services.stop_service(one)
    assert failure is not None and failure.startswith("service retriever exited with status -9 after 1 restart(s)")


def test_the_retriever_service_runs_with_the_authors_thread_caps():
    """CPU faiss under load crashed in OpenBLAS until the authors capped its threads at 32."""
    from omegaconf import OmegaConf

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "service" / "retriever.yaml"
    env = OmegaConf.to_container(OmegaConf.load(recipe))["env"]
    assert env == {"OMP_NUM_THREADS": "32", "OPENBLAS_NUM_THREADS": "32", "MKL_NUM_THREADS": "32"}


def test_bad_watch_settings_are_refused_naming_the_service(tmp_path: Path):
    from aclarena_slime.recipes.compose import RecipeError, load_recipe

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "stage2_search.yaml"
    with pytest.raises(RecipeError, match=r"services\.retriever: max_restarts must be >= 0"):
        load_recipe(recipe, [f"paths.root={tmp_path}", "services.retriever.max_restarts=-1"])


def test_the_dry_run_shows_the_services_env_and_restarts(tmp_path: Path, capsys):
    from aclarena_slime.launcher import stage

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "stage2_search.yaml"
    assert stage.main([str(recipe), "backend=slime", f"paths.root={tmp_path}", "--dry-run"]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("# service retriever")]
    assert "(watched, at most 2 restarts): OMP_NUM_THREADS=32 OPENBLAS_NUM_THREADS=32 MKL_NUM_THREADS=32 " in line


def test_the_service_sees_its_env(tmp_path: Path):
    port = _free_port()
    service = ServiceConfig(
        command=["{python}", "-c", "import os; print('caps', os.environ['OPENBLAS_NUM_THREADS'], flush=True); "
                 "import http.server as h; h.test(h.SimpleHTTPRequestHandler, port={port}, bind='{host}')"],
        host="127.0.0.1", port=port, ready_path="/", ready_timeout_s=30.0, url=f"http://127.0.0.1:{port}",
        env={"OPENBLAS_NUM_THREADS": "32"},
    )  # fmt: skip
    running = services.start_service("files", service, tmp_path, 0.1)
    services.stop_service(running)
    assert "caps 32" in (tmp_path / "files.log").read_text()


def test_a_reused_service_that_stops_answering_is_not_restarted_but_fails(tmp_path: Path):
    port = _free_port()
    service = ServiceConfig(command=["unused"], host="127.0.0.1", port=port, url=f"http://127.0.0.1:{port}",
                            check_interval_s=0.1, unready_timeout_s=0.2)  # fmt: skip
    running = [services.RunningService("user_sim", service.url, None, None, service)]
    watch = services.ServiceWatch(running, on_failure=lambda why: None)
    assert watch.check() is None  # not answering: the clock starts
    time.sleep(0.3)
    failure = watch.check()
    assert failure is not None and failure.startswith(f"service user_sim at {service.url} has not answered")
    assert "reused, not started here" in failure


def test_stop_job_never_hangs(tmp_path: Path, monkeypatch):
    script = tmp_path / "ray"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    monkeypatch.setattr(ray_job, "_ray", lambda: str(script))
    started = time.monotonic()
    assert ray_job.stop_job("http://127.0.0.1:8265", "aclarena-x", timeout_s=0.5) is False
    assert time.monotonic() - started < 10


@pytest.mark.slow
def test_a_user_simulator_killed_mid_job_stops_the_job_instead_of_spinning(tmp_path: Path, fake_ray: Path):
    """The local engine stands in for the user simulator (an OpenAI-compatible server, as under ``--smoke``):
    it answers the simulator's client, dies, and the job is stopped naming it."""
    import asyncio

    from aclarena_envs.retail.user_sim import LLMUser
    from aclarena_slime.local.tiny_model import save_tiny_checkpoint
    from aclarena_slime.plugin.contract import EpisodeAborted

    model = save_tiny_checkpoint(tmp_path / "tiny", with_model=True)
    port = _free_port()
    service = ServiceConfig(
        command=["{python}", "-m", "aclarena_slime", "local", "serve-engine", "--model", str(model),
                 "--host", "{host}", "--port", "{port}", "--served-name", "user_sim"],
        host="127.0.0.1", port=port, ready_path="/health", ready_timeout_s=120.0, url=f"http://127.0.0.1:{port}",
        max_restarts=0, check_interval_s=0.2, unready_timeout_s=2.0,
    )  # fmt: skip

    async def reply() -> str:
        sim = LLMUser(f"{service.url}/v1", "user_sim", max_tokens=4, retries=0)
        try:
            return await sim.session("a customer").reply("hello")
        finally:
            await sim.aclose()

    running = [services.start_service("user_sim", service, tmp_path / "logs", 0.2)]
    try:
        assert isinstance(asyncio.run(reply()), str)
        _kill_when_ready(running[0])
        with pytest.raises(EpisodeAborted):  # every retail episode now aborts: the filter would drop every group
            asyncio.run(reply())
        started = time.monotonic()
        status, stopped = submit_watched(["ray", "job", "submit", "--", "python", "train.py"],
                                         "http://127.0.0.1:8265", "stage3_retail", running)  # fmt: skip
        took = time.monotonic() - started
    finally:
        for one in running:
            services.stop_service(one)
    assert status != 0 and took < 30
    assert stopped is not None and stopped.startswith("service user_sim exited with status -9")
    assert "[serve-engine] serving" in stopped


def test_a_search_stage_whose_retriever_dies_mid_run_ends_non_zero_naming_it(tmp_path: Path, fake_ray: Path,
                                                                               monkeypatch, capsys):
    """The whole slime launch (``launch/stage.sh``) on one node: the Ray CLI and the GPU count are stand-ins,
    the retriever is the recipe's service over a tiny corpus, killed once the job runs. Before: the job ran on
    to its end and the stage reported success."""
    import threading

    from aclarena_envs.search.demo_corpus import generate, write_jsonl
    from aclarena_slime.launcher import stage
    from aclarena_slime.launcher.backend import BackendChoice

    corpus = write_jsonl(generate(20, seed=1).passages, tmp_path / "corpus.jsonl")
    monkeypatch.setattr(stage, "choose_backend", lambda requested: BackendChoice("slime", "a GPU node"))
    monkeypatch.setattr("aclarena_slime.launcher.hf_export.ensure_export", lambda recipe: None)
    monkeypatch.setattr(ray_job, "require_gpus", lambda ray, want: want)
    start = services.start_service

    def start_then_kill(name, service, log_dir, poll_s=1.0):
        running = start(name, service, log_dir, 0.1)
        threading.Timer(0.5, _kill_when_ready, [running]).start()  # mid-run: the job is streaming by then
        return running

    monkeypatch.setattr(services, "start_service", start_then_kill)
    command = f"['{{python}}',-m,aclarena_slime,serve-retriever,--corpus,{corpus},--host,'{{host}}',--port,'{{port}}']"
    started = time.monotonic()
    status = stage.main([
        "recipes/stage2_search.yaml", "backend=slime", "cluster=single_8", f"paths.root={tmp_path}",
        f"services.retriever.command={command}", f"services.retriever.port={_free_port()}",
        "services.retriever.max_restarts=0", "services.retriever.check_interval_s=0.2",
    ])  # fmt: skip
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert status == 1 and took < 60, err[-2000:]
    assert "the job was stopped: service retriever exited with status -9 after 0 restart(s)" in err
    assert "aclarena retriever listening on" in err  # its last log lines
    assert "job stop --address=http://127.0.0.1:8265 aclarena-stage2_search-" in (fake_ray / "calls.log").read_text()
