"""The local engine as an SGLang server, over real HTTP: what slime's external-engine mode calls."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import aiohttp
import pytest

from aclarena_slime.cli import CommandError
from aclarena_slime.cli.local import parse_adapters
from aclarena_slime.http_service import serving
from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.local.sglang_server import SGLangServer, called_endpoints


@pytest.fixture
async def server(engine_model, tiny_model_dir):
    log = io.StringIO()
    srv = SGLangServer(LocalEngine(engine_model, served_name="tiny"), tiny_model_dir, "127.0.0.1", 0, log=log)
    async with serving(srv.app()) as url, aiohttp.ClientSession() as session:
        srv.url, srv.session, srv.log_text = url, session, log
        yield srv


async def call(srv, method, path, **kwargs):
    async with srv.session.request(method, f"{srv.url}{path}", **kwargs) as resp:
        body = await resp.json() if resp.content_type == "application/json" else await resp.text()
        return resp.status, body


async def test_server_info_is_what_slime_checks_for_an_external_engine(server, tiny_model_dir):
    status, info = await call(server, "GET", "/server_info")
    assert status == 200
    # slime asserts enable_memory_saver == offload_rollout (False) and reads the parallel sizes.
    assert info["enable_memory_saver"] is False
    assert (info["tp_size"], info["pp_size"], info["dp_size"]) == (1, 1, 1)
    assert info["model_path"] == str(tiny_model_dir) and info["disaggregation_mode"] == "null"
    assert (await call(server, "GET", "/get_server_info"))[1]["enable_memory_saver"] is False
    status, model = await call(server, "GET", "/model_info")
    assert status == 200 and model["is_generation"] is True and model["model_type"] == "qwen3"


async def test_loads_count_requests_in_flight_and_abort_stops_them(server):
    params = {"max_new_tokens": 5000, "ignore_eos": True, "temperature": 1.0}
    long = asyncio.ensure_future(
        call(server, "POST", "/generate", json={"input_ids": [1, 2, 3], "sampling_params": params, "rid": "long"})
    )
    queued = asyncio.ensure_future(
        call(server, "POST", "/generate", json={"input_ids": [4, 5], "sampling_params": params, "rid": "queued"})
    )
    # A request that arrives mid-step waits for the next step boundary (as in SGLang's scheduler), so
    # poll until both are admitted; on a slow machine the second is briefly counted as waiting.
    for _ in range(2000):
        loads = (await call(server, "GET", "/v1/loads?include=core"))[1]["loads"]
        if loads[0]["num_running_reqs"] == 2:
            break
        assert loads[0]["num_running_reqs"] + loads[0]["num_waiting_reqs"] <= 2
        await asyncio.sleep(0.01)
    # Both decode together (the engine batches every request in flight, up to max_running_requests).
    assert loads == [{**loads[0], "dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 0}]
    assert loads[0]["num_used_tokens"] >= 5  # both prompts are in the KV cache
    legacy = (await call(server, "GET", "/get_load"))[1]
    assert legacy[0]["num_reqs"] == 2
    assert (await call(server, "POST", "/abort_request", json={"rid": "long"}))[0] == 200
    status, answer = await long
    assert status == 200 and answer["meta_info"]["finish_reason"]["type"] == "abort"
    assert answer["meta_info"]["id"] == "long" and answer["meta_info"]["completion_tokens"] < 5000
    assert (await call(server, "POST", "/abort_request", json={"abort_all": True}))[0] == 200
    status, answer = await queued
    assert status == 200 and answer["meta_info"]["finish_reason"]["type"] == "abort"
    loads = (await call(server, "GET", "/v1/loads"))[1]["loads"]
    assert loads[0]["num_running_reqs"] == loads[0]["num_waiting_reqs"] == 0


async def test_health_generate_flush_cache_and_lora_updates(server, adapter_dir):
    assert (await call(server, "GET", "/health"))[0] == 200
    assert (await call(server, "GET", "/health_generate"))[0] == 200
    assert server.engine.generated_tokens == 1  # SGLang's health check decodes one token
    for method in ("GET", "POST"):
        status, text = await call(server, method, "/flush_cache")
        assert status == 200 and text.startswith("Cache flushed.")
    status, body = await call(
        server, "POST", "/load_lora_adapter", json={"lora_name": "x", "lora_path": str(adapter_dir)}
    )
    assert status == 200 and body == {
        "success": True,
        "error_message": None,
        "loaded_adapters": {"x": str(adapter_dir)},
    }
    assert (await call(server, "GET", "/server_info"))[1]["lora_paths"] == {"x": str(adapter_dir)}
    status, body = await call(server, "POST", "/unload_lora_adapter", json={"lora_name": "x"})
    assert status == 200 and body["loaded_adapters"] == {}
    status, body = await call(server, "POST", "/unload_lora_adapter", json={"lora_name": "x"})
    assert status == 400 and body == {
        "success": False,
        "error_message": "LoRA with name x does not exist. Loaded LoRAs: dict_keys([])",
        "loaded_adapters": None,
    }



async def test_a_retired_adapter_whose_folder_is_gone_is_refused_in_sglangs_words(server, adapter_dir, tmp_path):
    """SGLang remembers x@0 and reloads it from its folder; with the folder gone it answers this 400."""
    folder = shutil.copytree(adapter_dir, tmp_path / "x@0")
    assert (await call(server, "POST", "/load_lora_adapter", json={"lora_name": "x@0", "lora_path": str(folder)}))[0] == 200
    assert (await call(server, "POST", "/unload_lora_adapter", json={"lora_name": "x@0"}))[0] == 200
    shutil.rmtree(folder)
    status, body = await call(server, "POST", "/generate", json={"input_ids": [1], "lora_path": "x@0"})
    assert status == 400 and body == {
        "error": {
            "message": "Failed to implicitly load LoRA adapter x@0: Repo id must be in the form 'repo_name' or "
            f"'namespace/repo_name': '{folder}'. Use `repo_type` argument if needed."
        }
    }


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "shape", "words"),
    [
        # A body that does not parse into the request type: FastAPI's ErrorResponse, type "Bad Request".
        ("POST", "/generate", {"data": b"{nope"}, 400, "validation", "not JSON"),
        ("POST", "/generate", {"json": [1, 2]}, 400, "validation", "JSON object"),
        ("POST", "/abort_request", {"json": {"rid": 3}}, 400, "validation", "rid"),
        ("POST", "/load_lora_adapter", {"json": {"lora_name": "x"}}, 400, "validation", "lora_path"),
        # A request the engine refuses: SGLang's _create_error_response, {"error": {"message"}}.
        ("POST", "/generate", {"json": {"input_ids": [1], "sampling_params": {"top_p": 0}}}, 400, "error", "top_p"),
        (
            "POST",
            "/generate",
            {"json": {"input_ids": [1], "sampling_params": {"temperature": -1}}},
            400,
            "error",
            ">= 0",
        ),
        ("POST", "/generate", {"json": {"input_ids": [1], "rid": 7}}, 400, "error", "rid"),
        ("POST", "/generate", {"json": {"input_ids": [1], "lora_path": "nobody"}}, 400, "error", "has never been loaded"),
        ("POST", "/generate", {"json": {"input_ids": [1] * 40_000}}, 400, "error", "context"),
        # FastAPI's HTTPException answers, in ErrorResponse with the status as type.
        ("GET", "/no_such_endpoint", {}, 404, "http", "Not Found"),
        ("GET", "/v1/loads?dp_rank=3", {}, 400, "http", "dp_rank"),
    ],
)
async def test_bad_requests_get_sglangs_error_shapes(server, method, path, kwargs, status, shape, words):
    got, body = await call(server, method, path, **kwargs)
    assert got == status
    if shape == "error":
        assert words in body["error"]["message"]
    else:
        assert body["object"] == "error" and body["code"] == status and words in body["message"]
        assert body["type"] == ("Bad Request" if shape == "validation" else str(status))


async def test_every_call_is_logged_for_the_smoke_report(server):
    await call(server, "GET", "/server_info")
    await call(server, "GET", "/server_info")
    await call(server, "POST", "/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
    await call(server, "GET", "/nope")
    calls = called_endpoints(server.log_text.getvalue())
    assert calls == {"GET /server_info": 2, "POST /generate": 1, "GET /nope": 1}
    assert calls == server.calls
    assert "[engine] GET /nope 404" in server.log_text.getvalue()


def test_adapter_arguments():
    assert parse_adapters(["a=/x", "b=/y=z"]) == {"a": "/x", "b": "/y=z"}
    for bad in (["a"], ["=x"], ["a="], ["a=/x", "a=/y"]):
        with pytest.raises(CommandError):
            parse_adapters(bad)


def test_serve_engine_command_serves_until_terminated(tmp_path, tiny_model_dir, adapter_dir):
    """``aclarena local serve-engine`` as slime meets it: its own process, loaded adapters, SIGTERM ends it."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, "-m", "aclarena_slime", "local", "serve-engine", "--model", str(tiny_model_dir),
            "--adapter", f"expert={adapter_dir}", "--port", str(port)]  # fmt: skip
    log = tmp_path / "engine.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        info = None
        for _ in range(600):
            if process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as resp:
                    info = __import__("json").loads(resp.read())
                break
            except OSError:
                time.sleep(0.2)
        assert info is not None, log.read_text()
        assert info["lora_paths"] == {"expert": str(adapter_dir)} and info["port"] == port
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    assert "[engine] GET /server_info 200" in log.read_text()


def test_serve_engine_refuses_a_model_that_is_not_there(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "aclarena_slime", "local", "serve-engine", "--model", str(tmp_path / "none")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "neither 'tiny' nor a Hugging Face model directory" in done.stderr
