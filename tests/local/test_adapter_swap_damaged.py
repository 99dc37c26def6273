"""A damaged adapter swapped in by name (issue 44 §5): refused while the old version still serves, and the
engine's refusal names the file and what is wrong with it."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import pytest

from aclarena_slime.adapter_swap import AdapterSwapError, swap_adapter
from aclarena_slime.local.engine import LocalEngine
from aclarena_slime.sglang_client import SGLangClient


@pytest.fixture
async def served(engine_model, adapter_dir):
    """A local engine serving ``expert`` from the good folder."""
    engine = LocalEngine(engine_model, served_name="tiny")
    async with engine.serve() as url:
        client = SGLangClient(url)
        await swap_adapter([client], "expert", adapter_dir, loaded=False)
        yield engine, client, url


def _damaged(adapter_dir: Path, tmp_path: Path, how: str) -> Path:
    bad = tmp_path / "expert"
    shutil.copytree(adapter_dir, bad)
    if how == "truncated-safetensors":
        weights = bad / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        (bad / "adapter_config.json").write_text('{"r": 4, "lora_alpha": ')
    return bad


_NAMED = {
    "truncated-safetensors": "adapter_model.safetensors",
    "broken-config": "adapter_config.json",
}


@pytest.mark.parametrize("how", sorted(_NAMED))
async def test_a_damaged_folder_swapped_by_name_leaves_the_old_version_serving(served, adapter_dir, tmp_path, how):
    engine, client, url = served
    bad = _damaged(adapter_dir, tmp_path, how)
    with pytest.raises(AdapterSwapError, match=_NAMED[how]) as caught:
        await swap_adapter([client], "expert", bad)
    assert "still serves its old version" in str(caught.value)
    assert engine.model.adapters == {"expert": str(adapter_dir)}, "the old version was not unloaded"
    async with aiohttp.ClientSession() as http:
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}, "lora_path": "expert"}
        async with http.post(f"{url}/generate", json=body) as resp:
            assert resp.status == 200
    await swap_adapter([client], "expert", adapter_dir)  # a good folder next time replaces it as ever
    assert engine.model.adapters == {"expert": str(adapter_dir)}


@pytest.mark.parametrize("how", sorted(_NAMED))
async def test_the_local_engine_names_the_bad_file_and_the_cause_in_a_400(served, adapter_dir, tmp_path, how):
    _, _, url = served
    bad = _damaged(adapter_dir, tmp_path, how)
    async with aiohttp.ClientSession() as http:
        body = {"lora_name": "other", "lora_path": str(bad)}
        async with http.post(f"{url}/load_lora_adapter", json=body) as resp:
            status, out = resp.status, await resp.json(content_type=None)
    assert status == 400 and out["success"] is False
    assert str(bad / _NAMED[how]) in out["error_message"]
    assert ("Error" in out["error_message"]) or ("header" in out["error_message"])


async def test_an_engine_with_no_room_for_a_trial_copy_is_swapped_untried(tiny_tokenizer, adapter_dir, tmp_path):
    """SGLang started with --max-loaded-loras equal to the adapters it serves refuses the trial load in these
    words (tokenizer_manager.py, load_lora_adapter): the swap goes on as before rather than failing."""
    from aiohttp import web

    from aclarena_slime.testing.fake_sglang import FakeSGLang

    class Full(FakeSGLang):
        async def _load(self, request: web.Request) -> web.Response:
            body = await request.json()
            if len(self.adapters) >= 1:
                message = (
                    f"Cannot load LoRA adapter {body['lora_name']} at path {body['lora_path']}. Maximum number "
                    "of loaded LoRA adapters is 1. Please unload some LoRA adapters before loading new ones."
                )
                return web.json_response({"success": False, "error_message": message}, status=400)
            return await super()._load(request)

    async with Full(tiny_tokenizer, ["ok"]) as engine:
        client = SGLangClient(engine.url)
        await swap_adapter([client], "expert", adapter_dir, loaded=False)
        newer = tmp_path / "newer"
        shutil.copytree(adapter_dir, newer)
        await swap_adapter([client], "expert", newer)
    assert engine.adapters == {"expert": str(newer)}
