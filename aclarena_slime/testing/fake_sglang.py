"""A fake SGLang engine for tests: the real ``/generate`` protocol with scripted replies.

Token ids in, token ids and log-probs out, finish reasons as SGLang reports them. The replies are
tokenized with the test's tokenizer; stop strings and ``max_new_tokens`` are honoured the way a real
engine does (a stop string ends the output after it, with no end-of-turn token; the budget cuts the
output and reports ``length``). Requests are recorded for assertions (``lora_path`` included). The OpenAI endpoints
(``/v1/completions``, ``/v1/chat/completions``, adapter from ``model="<base>:<adapter>"``) and
``stream: true`` (server-sent events, as SGLang sends them) are there for gateway tests; ``stop()`` and
``start()`` simulate a restart: same port, no adapters loaded. ``/pause_generation`` and
``/continue_generation`` validate their bodies as SGLang 0.5.15 does and record the pause modes.
Adapters behave as SGLang 0.5.15's (:mod:`aclarena_slime.sglang_errors`): once one is loaded the engine
refuses a never-loaded name, reloads an unloaded one from its folder, and refuses it when the folder is
gone, in SGLang's words; a restart forgets what was loaded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from aclarena_slime import sglang_errors
from aclarena_slime.http_service import serving

# sglang 0.5.15 managers/io_struct.py: PauseGenerationReqInput.mode, default "abort" (an empty body aborts
# every in-flight request); ContinueGenerationReqInput.torch_empty_cache: bool = True.
PAUSE_MODES = ("abort", "retract", "in_place")


@dataclass(frozen=True)
class Reply:
    text: str
    finish: str | None = None  # force "abort"; otherwise stop/length are computed
    end_of_turn: bool = True  # append the tokenizer's EOS when the text ends naturally


ReplySource = Sequence[str | Reply] | Callable[[dict[str, Any]], str | Reply]


def fake_logprob(position: int, token_id: int) -> float:
    """Deterministic, distinct log-probs so tests can check they are kept exactly."""
    return -round(0.001 * (token_id % 997) + 0.0001 * position, 6)


class FakeSGLang:
    """``async with FakeSGLang(tokenizer, ["reply 1", "reply 2"]) as engine: engine.port ...``"""

    def __init__(self, tokenizer: Any, replies: ReplySource) -> None:
        self.tokenizer = tokenizer
        self._replies = replies if callable(replies) else itertools.cycle(list(replies))
        self.requests: list[dict[str, Any]] = []
        self.adapters: dict[str, str] = {}
        self.remembered: dict[str, str] = {}  # every adapter loaded since the last start: SGLang's lora_ref_cache
        self.lora_enabled = False  # an adapter was loaded once: the engine runs with --enable-lora
        self.pause_modes: list[str] = []
        self.paused = False
        self.url = ""
        self._stack: contextlib.AsyncExitStack | None = None

    @property
    def host(self) -> str:
        return self.url.split("//")[1].rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/load_lora_adapter", self._load)
        app.router.add_post("/unload_lora_adapter", self._unload)
        app.router.add_post("/pause_generation", self._pause)
        app.router.add_post("/continue_generation", self._continue)
        app.router.add_post("/v1/completions", self._openai)
        app.router.add_post("/v1/chat/completions", self._openai)
        return app

    async def __aenter__(self) -> FakeSGLang:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._shut()

    async def start(self) -> None:
        """Serve (again): on a free port the first time, on the same port after :meth:`stop`."""
        self._stack = contextlib.AsyncExitStack()
        port = self.port if self.url else 0
        self.url = await self._stack.enter_async_context(serving(self.app(), port=port))

    async def stop(self) -> None:
        """Go down like a killed server: connections refused, loaded adapters forgotten."""
        await self._shut()
        self.adapters.clear()
        self.remembered.clear()

    async def _shut(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None

    def _next_reply(self, payload: dict[str, Any]) -> Reply:
        reply = self._replies(payload) if callable(self._replies) else next(self._replies)
        return reply if isinstance(reply, Reply) else Reply(str(reply))

    async def _generate(self, request: web.Request) -> web.Response:
        payload = await request.json()
        if isinstance(payload.get("text"), str) and "input_ids" not in payload:  # SGLang tokenizes text itself
            payload["input_ids"] = list(self.tokenizer.encode(payload["text"], add_special_tokens=False))
        if not isinstance(payload.get("input_ids"), list):
            return web.json_response({"error": {"message": "input_ids must be a list of token ids"}}, status=400)
        refused = self._resolve(payload.get("lora_path"))
        if refused is not None:
            return refused
        self.requests.append(payload)
        out = self.complete(payload)
        if not payload.get("stream"):
            return web.json_response(out)
        # SGLang's native stream: each event carries the text so far; the last one the full answer.
        ids = [item[1] for item in out["meta_info"]["output_token_logprobs"]]
        events = [
            {"text": self.tokenizer.decode(ids[: i + 1], skip_special_tokens=True), "meta_info": {"id": "stream"}}
            for i in range(len(ids) - 1)
        ]
        return await self._sse(request, [*events, out])

    async def _sse(self, request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for event in events:
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        model = str(payload.get("model") or "fake-model")
        adapter = model.split(":", 1)[1] if ":" in model else None
        refused = self._resolve(adapter)
        if refused is not None:
            return refused
        self.requests.append(payload)
        chat = request.path.endswith("/chat/completions")
        reply = self._next_reply(payload).text
        base = {"id": f"fake-{len(self.requests)}", "model": model, "created": 0}
        if not payload.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            choice.update({"message": {"role": "assistant", "content": reply}} if chat else {"text": reply})
            kind = "chat.completion" if chat else "text_completion"
            return web.json_response({**base, "object": kind, "choices": [choice]})
        pieces = [self.tokenizer.decode([i]) for i in self.tokenizer.encode(reply, add_special_tokens=False)]
        kind = "chat.completion.chunk" if chat else "text_completion"
        events = [
            {**base, "object": kind, "choices": [{"index": 0, **({"delta": {"content": p}} if chat else {"text": p})}]}
            for p in pieces
        ]
        return await self._sse(request, events)

    def _resolve(self, adapter: str | None) -> web.Response | None:
        """SGLang's ``_resolve_lora_path``: serve a loaded adapter, reload a remembered one from its folder,
        else its 400 (``{"error": {"message"}}``, as ``_create_error_response`` words a ValueError)."""
        if adapter is None or not (self.lora_enabled or self.adapters):
            return None
        message = sglang_errors.resolve_request(adapter, self.adapters, self.remembered)
        if message is not None:
            return web.json_response({"error": {"message": message}}, status=400)
        if adapter not in self.adapters:  # "Reloading evicted adapter"
            self.adapters[adapter] = self.remembered[adapter]
        return None

    def complete(self, payload: dict[str, Any]) -> dict[str, Any]:
        params = payload.get("sampling_params") or {}
        reply = self._next_reply(payload)
        text, matched = reply.text, None
        for stop in params.get("stop") or []:
            at = text.find(stop)
            if at >= 0 and (matched is None or at < text.find(matched)):
                matched = stop
        if matched is not None:
            text = text[: text.find(matched) + len(matched)]
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if matched is None and reply.end_of_turn:
            ids.append(self.tokenizer.eos_token_id)
        finish: dict[str, Any] = {"type": "stop", "matched": matched or self.tokenizer.eos_token_id}
        budget = params.get("max_new_tokens")
        if budget is not None and len(ids) > budget:
            ids = ids[:budget]
            finish = {"type": "length", "length": budget}
        if reply.finish == "abort":
            finish = {"type": "abort", "message": "aborted by the fake engine"}
        out_text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if matched and not params.get("no_stop_trim") and out_text.endswith(matched):
            out_text = out_text[: -len(matched)]
        return {
            "text": out_text,
            "meta_info": {
                "id": f"fake-{len(self.requests)}",
                "finish_reason": finish,
                "prompt_tokens": len(payload["input_ids"]),
                "completion_tokens": len(ids),
                "output_token_logprobs": [[fake_logprob(i, t), t, None] for i, t in enumerate(ids)],
            },
        }

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _load(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.adapters[body["lora_name"]] = self.remembered[body["lora_name"]] = body["lora_path"]
        self.lora_enabled = True
        return web.json_response({"success": True, "error_message": None, "loaded_adapters": dict(self.adapters)})

    async def _unload(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.adapters.pop(body["lora_name"], None) is None:
            message = sglang_errors.unload_unknown(body["lora_name"], self.adapters)
            return web.json_response({"success": False, "error_message": message, "loaded_adapters": None}, status=400)
        return web.json_response({"success": True, "error_message": None, "loaded_adapters": dict(self.adapters)})

    async def _pause(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            return _unprocessable(["body", "mode"], f"Input should be {', '.join(map(repr, PAUSE_MODES))}")
        self.pause_modes.append(mode)
        self.paused = True
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if isinstance(body, web.Response):
            return body
        if not isinstance(body.get("torch_empty_cache", True), bool):
            return _unprocessable(["body", "torch_empty_cache"], "Input should be a valid boolean")
        self.paused = False
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})


def _unprocessable(loc: list[str], message: str) -> web.Response:
    """FastAPI's answer to a body that fails validation."""
    return web.json_response({"detail": [{"type": "value_error", "loc": loc, "msg": message}]}, status=422)


async def _json_object(request: web.Request) -> dict[str, Any] | web.Response:
    """The body as a JSON object (extra keys ignored, as SGLang's request structs do), or a 422."""
    try:
        body = await request.json()
    except json.JSONDecodeError:
        return _unprocessable(["body"], "JSON decode error")
    if not isinstance(body, dict):
        return _unprocessable(["body"], "Input should be a valid dictionary")
    return body
