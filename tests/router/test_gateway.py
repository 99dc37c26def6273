"""The gateway against fake SGLang engines speaking the real protocol."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import pytest
from aiohttp import web

from aclarena_slime.cli import main as cli_main
from aclarena_slime.testing.fake_sglang import FakeSGLang

from .conftest import TAGS, client, gateway, post, write_manifest


async def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _generate_payload() -> dict:
    return {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}, "return_logprob": True}


async def test_every_engine_gets_every_expert_at_start(tiny_tokenizer, manifest):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, FakeSGLang(tiny_tokenizer, ["ok"]) as b:
        async with gateway([a.url, b.url], manifest):
            for engine in (a, b):
                assert set(engine.adapters) == {f"{t}-expert" for t in TAGS}
                assert engine.adapters["retail-expert"] == str(manifest.parent.resolve() / "experts" / "retail")


async def test_tagged_requests_arrive_with_the_right_lora_path(tiny_tokenizer, manifest):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, FakeSGLang(tiny_tokenizer, ["ok"]) as b:
        async with gateway([a.url, b.url], manifest) as (url, _), client() as http:
            for tag in TAGS:
                status, out = await post(http, f"{url}/generate", _generate_payload(), **{"X-Aclarena-Env": tag})
                assert status == 200 and out["text"] == "ok"
                chat = {"model": f"qwen3-8b-sdft:{tag}", "messages": [{"role": "user", "content": "hi"}]}
                status, out = await post(http, f"{url}/v1/chat/completions", chat)
                assert status == 200 and out["choices"][0]["message"]["content"] == "ok"
                status, _ = await post(
                    http, f"{url}/v1/completions", {"model": "qwen3-8b-sdft", "prompt": "p"}, **{"X-Aclarena-Env": tag}
                )
                assert status == 200
        requests = a.requests + b.requests
        assert len(a.requests) >= 4 and len(b.requests) >= 4, "load is spread over both engines"
    native = [r["lora_path"] for r in requests if "input_ids" in r]
    openai = [r["model"] for r in requests if "input_ids" not in r]
    assert sorted(native) == sorted(f"{t}-expert" for t in TAGS)
    assert sorted(openai) == sorted(f"qwen3-8b-sdft:{t}-expert" for t in TAGS for _ in range(2))


async def test_the_body_reaches_the_engine_unchanged_but_for_the_adapter(tiny_tokenizer, manifest):
    """A tagged /generate is forwarded as the client sent it with ``lora_path`` spliced in (no second
    encoding); a body that names its own ``lora_path`` or is not plain UTF-8 JSON is re-encoded."""
    payload = {**_generate_payload(), "text": "naïve ✓ \\boxed{1}", "rid": "r-1"}
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest) as (url, _), client() as http:
        bodies = [
            json.dumps(payload).encode(),
            b"  \n" + json.dumps(payload, ensure_ascii=False, indent=1).encode(),
            json.dumps({**payload, "lora_path": None}).encode(),
            b"\xef\xbb\xbf" + json.dumps(payload).encode(),  # a byte-order mark: still valid JSON to Python
        ]
        for body in bodies:
            async with http.post(f"{url}/generate", data=body, headers={"X-Aclarena-Env": "retail"}) as resp:
                assert resp.status == 200, await resp.text()
    assert len(a.requests) == len(bodies)
    for received in a.requests:
        assert received == {**payload, "lora_path": "retail-expert"}


async def test_a_tagged_body_is_not_decoded_but_cannot_smuggle_an_adapter(tiny_tokenizer, manifest):
    """With the tag header, /generate goes on undecoded with the adapter spliced in; a ``lora_path`` key
    written with a ``\\u`` escape is still found (the engine would take the last of two keys)."""
    smuggled = b'{"input_ids": [1, 2, 3], "lora\\u005fpath": "../../etc/passwd"}'
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest) as (url, pool), client() as http:
        async with http.post(f"{url}/generate", data=smuggled, headers={"X-Aclarena-Env": "retail"}) as resp:
            assert resp.status == 200, await resp.text()
        assert a.requests[-1]["lora_path"] == "retail-expert"
        async with http.post(f"{url}/generate", data=b'{"input_ids": [1,', headers={"X-Aclarena-Env": "math"}) as resp:
            assert resp.status >= 400, "a cut body is the engine's to refuse"
        assert pool.engines[0].healthy, "an engine refusing a request is not down"
        status, _ = await post(http, f"{url}/generate", _generate_payload(), **{"X-Aclarena-Env": "math"})
        assert status == 200 and a.requests[-1]["lora_path"] == "math-expert"


async def test_unknown_tag_and_traversal_are_refused(tiny_tokenizer, manifest):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest) as (url, _), client() as http:
        status, out = await post(http, f"{url}/v1/chat/completions", {"model": "qwen3-8b-sdft:chess", "messages": []})
        assert status == 400 and "known tags: ifeval, math, retail, search" in out["error"]["message"]
        status, out = await post(http, f"{url}/generate", {**_generate_payload(), "lora_path": "../../etc/passwd"})
        assert status == 400 and "unknown adapter '../../etc/passwd'" in out["error"]["message"]
        async with http.post(f"{url}/generate", data=b"{not json") as resp:
            assert resp.status == 400 and "not valid JSON" in (await resp.json())["error"]["message"]
    assert a.requests == [], "nothing refused reached the engine"


def test_cli_refuses_a_manifest_pointing_outside(tmp_path, capsys):
    manifest = write_manifest(tmp_path, experts={"math": {"adapter": "math", "path": "../../etc/passwd"}})
    assert cli_main(["serve-router", "--engine", "http://127.0.0.1:1", "--experts", str(manifest)]) == 2
    assert "outside the experts' directory" in capsys.readouterr().err


async def test_restarted_engine_gets_its_adapters_back(tiny_tokenizer, manifest):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, FakeSGLang(tiny_tokenizer, ["ok"]) as b:
        async with gateway([a.url, b.url], manifest) as (url, pool), client() as http:
            await a.stop()
            assert a.adapters == {}
            await _until(lambda: not pool.engines[0].healthy)
            for _ in range(4):  # served by the survivor meanwhile
                status, _ = await post(http, f"{url}/generate", _generate_payload(), **{"X-Aclarena-Env": "math"})
                assert status == 200
            assert len(b.requests) == 4
            await a.start()
            await _until(lambda: pool.engines[0].healthy)
            assert set(a.adapters) == {f"{t}-expert" for t in TAGS}
            async with http.get(f"{url}/health") as resp:
                health = await resp.json()
            assert resp.status == 200 and health["healthy"] == 2


async def test_restart_between_health_checks_is_caught_by_the_engine_answer(tiny_tokenizer, manifest):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a:
        async with gateway([a.url], manifest, health_interval_s=3600) as (url, _), client() as http:
            await a.stop()
            await a.start()
            a.adapters["other"] = "/elsewhere"  # started with --lora-paths other=...: ours are gone
            status, out = await post(http, f"{url}/generate", _generate_payload(), **{"X-Aclarena-Env": "ifeval"})
            assert status == 200 and out["text"] == "ok"
            assert "ifeval-expert" in a.adapters and a.requests[-1]["lora_path"] == "ifeval-expert"


async def test_all_engines_down_is_a_503_that_says_so(tiny_tokenizer, manifest):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, FakeSGLang(tiny_tokenizer, ["ok"]) as b:
        async with gateway([a.url, b.url], manifest) as (url, pool), client() as http:
            await a.stop()
            await b.stop()
            status, out = await post(http, f"{url}/generate", _generate_payload(), **{"X-Aclarena-Env": "math"})
            assert status == 503 and "no healthy SGLang engine" in out["error"]["message"]
            assert a.url in out["error"]["message"] and b.url in out["error"]["message"]
            async with http.get(f"{url}/health") as resp:
                assert resp.status == 503 and (await resp.json())["healthy"] == 0


class _Drops(FakeSGLang):
    """Healthy to the health check; drops the connection of every generation request (a crash mid-request)."""

    async def _generate(self, request):
        if (await request.json()).get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"text": "half"}\n\n')
        request.transport.close()
        return web.Response()


async def test_an_engine_failing_mid_request_is_a_502_and_marked_down(tiny_tokenizer, manifest):
    async with _Drops(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest, health_interval_s=3600) as (url, pool):
        async with client() as http:
            status, out = await post(http, f"{url}/generate", _generate_payload(), **{"X-Aclarena-Env": "math"})
        assert status == 502 and out["error"]["type"] == "bad_gateway" and a.url in out["error"]["message"]
        assert not pool.engines[0].healthy and "request failed" in pool.engines[0].reason
        await pool.check_all()  # back up at the next good health check
        assert pool.engines[0].healthy
        async with client() as http:
            with pytest.raises(aiohttp.ClientPayloadError):  # headers already sent: the stream is cut
                async with http.post(
                    f"{url}/generate", json={**_generate_payload(), "stream": True}, headers={"X-Aclarena-Env": "math"}
                ) as resp:
                    await resp.read()
        assert not pool.engines[0].healthy and "stream broke" in pool.engines[0].reason


async def test_adapter_that_fails_to_load_is_named_in_the_503(tiny_tokenizer, tmp_path):
    manifest = write_manifest(tmp_path)

    class Picky(FakeSGLang):
        async def _load(self, request):
            body = await request.json()
            if body["lora_name"] == "retail-expert":
                from aiohttp import web

                return web.json_response({"error": {"message": "rank 64 > max_lora_rank 16"}}, status=400)
            return await super()._load(request)

    async with Picky(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest) as (url, _), client() as http:
        status, _ = await post(http, f"{url}/generate", _generate_payload(), **{"X-Aclarena-Env": "math"})
        assert status == 200
        status, out = await post(http, f"{url}/generate", _generate_payload(), **{"X-Aclarena-Env": "retail"})
        assert (
            status == 503 and "retail-expert" in out["error"]["message"] and "max_lora_rank" in out["error"]["message"]
        )


async def test_api_key(tiny_tokenizer, manifest):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest, api_key="s3cret") as (url, _):
        async with client() as http:
            status, out = await post(http, f"{url}/generate", _generate_payload(), **{"X-Aclarena-Env": "math"})
            assert status == 401 and "API key" in out["error"]["message"]
            status, _ = await post(
                http,
                f"{url}/generate",
                _generate_payload(),
                **{"X-Aclarena-Env": "math", "Authorization": "Bearer nope"},
            )
            assert status == 401
            status, _ = await post(
                http,
                f"{url}/generate",
                _generate_payload(),
                **{"X-Aclarena-Env": "math", "Authorization": "Bearer s3cret"},
            )
            assert status == 200
            async with http.get(f"{url}/health") as resp:
                assert resp.status == 200
    assert len(a.requests) == 1


async def _events(resp) -> list[str]:
    return [line[6:] for line in (await resp.text()).splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("endpoint", ["/generate", "/v1/chat/completions", "/v1/completions"])
async def test_streaming_passes_through(tiny_tokenizer, manifest, endpoint):
    async with FakeSGLang(tiny_tokenizer, ["hello streaming world"]) as a, gateway([a.url], manifest) as (url, _):
        payload = (
            {**_generate_payload(), "sampling_params": {"max_new_tokens": 64}}
            if endpoint == "/generate"
            else {"model": "qwen3-8b-sdft:search", "messages": [{"role": "user", "content": "q"}], "prompt": "q"}
        )
        async with (
            client() as http,
            http.post(
                f"{url}{endpoint}", json={**payload, "stream": True}, headers={"X-Aclarena-Env": "search"}
            ) as resp,
        ):
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            assert resp.headers["X-Aclarena-Expert"].startswith("search-expert")
            events = await _events(resp)
    assert events[-1] == "[DONE]" and len(events) > 3
    chunks = [json.loads(e) for e in events[:-1]]
    if endpoint == "/generate":
        assert chunks[-1]["text"] == "hello streaming world"
        assert a.requests[-1]["lora_path"] == "search-expert"
    else:
        key = "delta" if "chat" in endpoint else None
        text = "".join(c["choices"][0][key]["content"] if key else c["choices"][0]["text"] for c in chunks)
        assert text == "hello streaming world"
        assert a.requests[-1]["model"] == "qwen3-8b-sdft:search-expert"


async def test_models_lists_base_and_experts(tiny_tokenizer, manifest):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as a, gateway([a.url], manifest) as (url, _), client() as http:
        async with http.get(f"{url}/v1/models") as resp:
            ids = [m["id"] for m in (await resp.json())["data"]]
    assert ids == ["qwen3-8b-sdft"] + [f"qwen3-8b-sdft:{t}" for t in sorted(TAGS)]


async def test_serve_router_command_end_to_end(tiny_tokenizer, manifest):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as engine:
        cmd = [sys.executable, "-m", "aclarena_slime", "serve-router", "--engine", engine.url]
        cmd += ["--experts", str(manifest), "--port", "0", "--api-key", "k"]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
        try:
            line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
            assert line.startswith("aclarena router listening on http://127.0.0.1:")
            url = line.split(" on ")[1].strip()
            async with client() as http:
                status, out = await post(
                    http,
                    f"{url}/v1/chat/completions",
                    {"model": "qwen3-8b-sdft:retail", "messages": []},
                    Authorization="Bearer k",
                )
        finally:
            proc.terminate()
            assert await proc.wait() == 0, "SIGTERM stops the router cleanly"
        assert set(engine.adapters) == {f"{t}-expert" for t in TAGS}
    assert status == 200 and out["choices"][0]["message"]["content"] == "ok"
    assert engine.requests[-1]["model"] == "qwen3-8b-sdft:retail-expert"
