"""SGLang 0.5.15's words for an adapter it does not serve, and the one recogniser the callers share."""

from __future__ import annotations

import pytest

from aclarena_slime import sglang_errors
from aclarena_slime.sglang_client import SGLangClient, SGLangError
from aclarena_slime.testing.fake_sglang import FakeSGLang


def test_messages_are_sglangs_own():
    # tokenizer_manager.py _resolve_lora_path and lora_registry.py unregister, SGLang 0.5.15
    assert sglang_errors.never_loaded("math@3", ["math@4"]) == (
        "Got LoRA adapter that has never been loaded: math@3\nAll loaded adapters: dict_keys(['math@4'])."
    )
    assert sglang_errors.implicit_load_failed("math@3", "gone") == "Failed to implicitly load LoRA adapter math@3: gone"
    assert sglang_errors.unload_unknown("x", []) == "LoRA with name x does not exist. Loaded LoRAs: dict_keys([])"


def test_resolve_follows_the_remembered_folder(tmp_path):
    folder = tmp_path / "math@3"
    folder.mkdir()
    remembered = {"math@3": str(folder)}
    assert sglang_errors.resolve_request("math@3", ["math@3"], remembered) is None
    assert sglang_errors.resolve_request("math@3", [], remembered) is None  # reloaded from its folder
    folder.rmdir()
    assert sglang_errors.resolve_request("math@3", [], remembered).startswith("Failed to implicitly load LoRA adapter")
    assert "never been loaded" in sglang_errors.resolve_request("math@3", [], {})


@pytest.mark.parametrize(
    ("status", "message", "missing"),
    [
        (400, "Got LoRA adapter that has never been loaded: a\nAll loaded adapters: dict_keys([]).", True),
        (400, "Failed to implicitly load LoRA adapter a: Repo id must be in the form ...", True),
        (400, "The following requested LoRA adapters are not loaded: a; loaded: none", True),
        (404, "adapter 'a' is not loaded; loaded: none", True),
        (400, "input_ids must be a list", False),
        (500, "Got LoRA adapter that has never been loaded: a", False),
    ],
)
def test_recogniser(status, message, missing):
    assert sglang_errors.is_adapter_missing(status, message) is missing


async def test_fake_engine_speaks_sglang_after_unload_and_restart(tmp_path, tiny_tokenizer):
    folder = tmp_path / "a@0"
    folder.mkdir()
    async with FakeSGLang(tiny_tokenizer, ["hi"]) as engine:
        client = SGLangClient(engine.url)
        await client.post("/load_lora_adapter", {"lora_name": "a@0", "lora_path": str(folder)})
        await client.post("/unload_lora_adapter", {"lora_name": "a@0"})
        await client.generate([1, 2], {"max_new_tokens": 2}, lora_path="a@0")  # implicitly reloaded
        assert "a@0" in engine.adapters
        await client.post("/unload_lora_adapter", {"lora_name": "a@0"})
        folder.rmdir()
        with pytest.raises(SGLangError) as gone:
            await client.generate([1, 2], {"max_new_tokens": 2}, lora_path="a@0")
        assert gone.value.status == 400 and "Failed to implicitly load LoRA adapter a@0: Repo id" in gone.value.message
        await engine.stop()
        await engine.start()
        with pytest.raises(SGLangError) as restarted:
            await client.generate([1, 2], {"max_new_tokens": 2}, lora_path="a@0")
        assert restarted.value.status == 400 and "has never been loaded: a@0" in restarted.value.message
        with pytest.raises(SGLangError, match="LoRA with name a@0 does not exist"):
            await client.post("/unload_lora_adapter", {"lora_name": "a@0"})
