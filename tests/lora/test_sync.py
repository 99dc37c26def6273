"""Adapter-only sync against a fake SGLang server speaking the real endpoints and payloads."""

from __future__ import annotations

import base64
import io
import os
import pickle

import pytest
import torch
from aiohttp import web

from aclarena_slime.lora.sync import AdapterSyncError, payload_schema_for, sync_adapter

TENSORS = {
    "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 8),
    "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(8, 4),
}
CONFIG = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}


class FakeSGLang:
    """Records every call; holds adapters by name like SGLang's LoRA registry."""

    def __init__(self, version: str, tp_size: int = 2, fail_load: bool = False, load_status: int = 200) -> None:
        self.version, self.tp_size, self.fail_load, self.load_status = version, tp_size, fail_load, load_status
        self.calls: list[str] = []
        self.adapters: dict[str, dict] = {}
        self.bodies: dict[str, dict] = {}
        self.folder_at_unload: dict[str, bool] = {}  # name -> its folder still there when unloaded

    async def __aenter__(self) -> str:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_get("/get_server_info", self._info)
        for endpoint in ("pause_generation", "continue_generation", "unload_lora_adapter", "load_lora_adapter"):
            app.router.add_post(f"/{endpoint}", self._handler(endpoint))
        app.router.add_post("/load_lora_adapter_from_tensors", self._from_tensors)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()

    async def _info(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version, "tp_size": self.tp_size})

    def _handler(self, endpoint: str):
        async def handle(request: web.Request) -> web.Response:
            body = await request.json()
            self.calls.append(endpoint)
            self.bodies[endpoint] = body
            if endpoint == "unload_lora_adapter" and body["lora_name"] not in self.adapters:
                return web.json_response({"success": False, "error_message": "not loaded"}, status=400)
            if endpoint == "unload_lora_adapter":
                path = self.adapters.pop(body["lora_name"]).get("path")
                self.folder_at_unload[body["lora_name"]] = path is not None and os.path.isdir(path)
            if endpoint == "load_lora_adapter" and self.load_status >= 400:
                return web.json_response({"error": "server overloaded"}, status=self.load_status)
            if endpoint == "load_lora_adapter":
                self.adapters[body["lora_name"]] = {"path": body["lora_path"]}
            return web.json_response({"success": True})

        return handle

    async def _from_tensors(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append("load_lora_adapter_from_tensors")
        self.bodies["load_lora_adapter_from_tensors"] = body
        if self.fail_load:
            return web.json_response({"success": False, "error_message": "rank too large"}, status=400)
        new_schema = payload_schema_for(self.version) == "serialized_named_tensors"
        if new_schema:
            assert len(body["serialized_named_tensors"]) == self.tp_size
            blob = body["serialized_named_tensors"][0]
        else:
            blob = body["serialized_tensors"]
        # Decodes only because this fake runs in the sender's process; a separate SGLang process cannot
        # resolve CPU shared storage (AuthenticationError), which is why disk is the default mode.
        tensors = pickle.load(io.BytesIO(base64.b64decode(blob)))
        self.adapters[body["lora_name"]] = {"tensors": tensors, "config": body["config_dict"]}
        return web.json_response({"success": True})


def test_schema_by_version():
    assert payload_schema_for("0.5.15.post1") == "serialized_tensors"
    assert payload_schema_for("0.5.8") == "serialized_tensors"
    assert payload_schema_for("0.5.18") == "serialized_named_tensors"
    assert payload_schema_for("0.5.23rc0") == "serialized_named_tensors"
    with pytest.raises(AdapterSyncError):
        payload_schema_for("dev")


@pytest.mark.parametrize("version", ["0.5.15.post1", "0.5.23"])
async def test_tensors_payload_schema_and_call_order(version):
    """The request sequence and the payload field per SGLang version, read back in this same process.

    It does not show that a separate SGLang process can read the blob (it cannot for CPU tensors).
    """
    fake = FakeSGLang(version)
    async with fake as url:
        first = await sync_adapter([url], "math", TENSORS, CONFIG, mode="tensors")
        assert fake.calls == [
            "pause_generation",
            "unload_lora_adapter",  # refused: nothing loaded yet, tolerated
            "load_lora_adapter_from_tensors",
            "continue_generation",
        ]
        updated = {k: v + 1 for k, v in TENSORS.items()}
        await sync_adapter([url], "math", updated, CONFIG, mode="tensors")
    loaded = fake.adapters["math"]
    assert loaded["config"] == CONFIG
    assert all(torch.equal(loaded["tensors"][k], v) for k, v in updated.items())
    assert first.payload_bytes == sum(t.numel() * 4 for t in TENSORS.values())
    assert first.schema == payload_schema_for(version)


async def test_disk_sync_is_the_default_and_loads_a_peft_dir(tmp_path):
    from safetensors.torch import load_file

    fake = FakeSGLang("0.5.15")
    async with fake as url:
        result = await sync_adapter([url, url], "search", TENSORS, CONFIG, sync_dir=str(tmp_path))
    path = fake.adapters["search"]["path"]
    assert path == str((tmp_path / "search").resolve())  # <sync_dir>/<adapter name>: what the stage reports
    assert result.schema == "peft_dir" and result.servers == 2
    written = load_file(f"{path}/adapter_model.safetensors")
    assert written.keys() == TENSORS.keys()
    assert fake.calls.count("continue_generation") == 2


async def test_refused_load_raises_and_generation_resumes():
    fake = FakeSGLang("0.5.23", fail_load=True)
    async with fake as url:
        with pytest.raises(AdapterSyncError, match="rank too large"):
            await sync_adapter([url], "retail", TENSORS, CONFIG, mode="tensors")
    assert fake.calls[-1] == "continue_generation"


async def test_disk_sync_without_sync_dir_is_refused():
    with pytest.raises(AdapterSyncError, match="sync_dir"):
        await sync_adapter(["http://127.0.0.1:9"], "math", TENSORS, CONFIG)


async def test_a_failed_load_is_not_retried(tmp_path):
    fake = FakeSGLang("0.5.23", load_status=503)
    async with fake as url:
        with pytest.raises(AdapterSyncError, match="server overloaded"):
            await sync_adapter([url], "math", TENSORS, CONFIG, sync_dir=str(tmp_path))
    assert fake.calls.count("load_lora_adapter") == 1
    # refused on its trial load (adapter_swap loads a folder under a temporary name first): generation
    # was never paused, and the old version was never unloaded
    assert fake.calls.count("pause_generation") == fake.calls.count("continue_generation")
    assert fake.bodies["unload_lora_adapter"] == {"lora_name": "math.incoming"}


async def test_pause_mode_reaches_sglang_explicitly(tmp_path):
    """SGLang 0.5.15 reads an empty /pause_generation body as ``abort``: the mode is always sent."""
    from aclarena_slime.testing.fake_sglang import FakeSGLang as Engine

    async with Engine(None, []) as engine:
        await sync_adapter([engine.url], "math", TENSORS, CONFIG, sync_dir=str(tmp_path), pause_mode="retract")
        await sync_adapter([engine.url], "math", TENSORS, CONFIG, sync_dir=str(tmp_path))
    assert engine.pause_modes == ["retract", "abort"]
    assert not engine.paused and engine.adapters == {"math": str(tmp_path / "math")}


@pytest.mark.parametrize(
    "body, status, mode",
    [
        ({}, 200, "abort"),
        ({"mode": "retract", "rid": None}, 200, "retract"),
        ({"mode": "drain"}, 422, None),
        ([], 422, None),
    ],
)
async def test_fake_engine_validates_pause_bodies_like_sglang(body, status, mode):
    import aiohttp

    from aclarena_slime.testing.fake_sglang import FakeSGLang as Engine

    async with Engine(None, []) as engine, aiohttp.ClientSession() as session:
        async with session.post(f"{engine.url}/pause_generation", json=body) as answer:
            assert answer.status == status
        async with session.post(f"{engine.url}/continue_generation", json={"torch_empty_cache": "yes"}) as answer:
            assert answer.status == 422
    assert engine.pause_modes == ([mode] if mode else [])
    assert engine.paused == (mode is not None)


async def test_versioned_sync_loads_beside_and_retires_past_the_budget(tmp_path):
    """name@N is loaded next to the versions in use (no pause: no request loses its adapter), the ledger
    names it, and the version past the budget is unloaded and its folder removed."""
    from aclarena_slime.adapter_swap import AdapterLedger

    fake = FakeSGLang("0.5.15")
    async with fake as url:
        for version in range(3):
            result = await sync_adapter(
                [url], "retail", TENSORS, CONFIG, sync_dir=str(tmp_path), version=version, staleness_budget=1
            )
    assert result.served == "retail@2" and result.checksum
    assert fake.calls == ["load_lora_adapter"] * 3 + ["unload_lora_adapter"]
    assert fake.bodies["unload_lora_adapter"] == {"lora_name": "retail@0"}
    assert sorted(fake.adapters) == ["retail@1", "retail@2"]
    assert AdapterLedger(tmp_path).read()["retail"] == {"current": 2, "resident": [1, 2], "checksum": result.checksum}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "retail",
        "retail@1",
        "retail@2",
        "versions.json",
    ]


async def test_versioned_sync_publishes_the_current_version_under_the_plain_name(tmp_path):
    """<sync_dir>/<name> is the stage's expert (the stage's adapter check, the monitor's keep): each
    versioned sync leaves the version it just made current there, whole."""
    from aclarena_slime.adapter_swap import adapter_checksum

    fake = FakeSGLang("0.5.15")
    async with fake as url:
        for version, scale in enumerate((1.0, 2.0, 3.0)):
            tensors = {k: v + scale for k, v in TENSORS.items()}
            result = await sync_adapter(
                [url], "retail", tensors, CONFIG, sync_dir=str(tmp_path), version=version, staleness_budget=1
            )
            assert adapter_checksum(tmp_path / "retail") == result.checksum == adapter_checksum(tmp_path / result.served)
    assert "retail" not in fake.adapters  # published for the stage, never loaded under the plain name


async def test_a_retired_folder_is_gone_before_its_unload(tmp_path, tiny_tokenizer):
    """SGLang reloads an unloaded adapter from its folder when a late request names it: the folder must
    be gone before the unload, so a straggler for a retired version is refused in SGLang's words."""
    from aclarena_slime.sglang_client import SGLangClient, SGLangError
    from aclarena_slime.testing.fake_sglang import FakeSGLang as Engine

    fake = FakeSGLang("0.5.15")
    async with fake as url:
        for version in range(3):
            await sync_adapter([url], "retail", TENSORS, CONFIG, sync_dir=str(tmp_path), version=version, staleness_budget=1)
    assert fake.folder_at_unload == {"retail@0": False}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".retired")]
    async with Engine(tiny_tokenizer, ["ok"]) as engine:
        for version in range(3):
            await sync_adapter(
                [engine.url], "retail", TENSORS, CONFIG, sync_dir=str(tmp_path / "b"), version=version, staleness_budget=1
            )
        with pytest.raises(SGLangError) as late:
            await SGLangClient(engine.url).generate([1, 2], {"max_new_tokens": 2}, lora_path="retail@0")
    assert late.value.status == 400 and late.value.message.startswith("Failed to implicitly load LoRA adapter retail@0")


async def test_a_folder_that_does_not_match_its_checksum_is_never_loaded(tmp_path, monkeypatch):
    """The sync path reads back what it wrote (what every server will read) before any load."""
    from aclarena_slime.lora import sync

    write = sync.write_peft_dir

    def torn_write(out_dir, tensors, config):
        path = write(out_dir, tensors, config)
        with open(path / "adapter_model.safetensors", "r+b") as handle:
            handle.seek(-1, 2)
            handle.write(b"\x7f")
        return path

    monkeypatch.setattr(sync, "write_peft_dir", torn_write)
    fake = FakeSGLang("0.5.15")
    async with fake as url:
        with pytest.raises(AdapterSyncError, match="checksum"):
            await sync_adapter([url], "math", TENSORS, CONFIG, sync_dir=str(tmp_path), version=0)
    assert fake.calls == []
