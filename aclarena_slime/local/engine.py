"""The embedded engine: SGLang's HTTP API (the subset our rollout and router use) over :class:`MultiLoraModel`.

Endpoints: ``POST /generate`` (``input_ids`` or ``text``, ``sampling_params``, ``return_logprob``,
``logprob_start_len``, ``return_text_in_logprobs``, ``lora_path``; ``max_new_tokens: 0`` scores the prompt), ``POST /load_lora_adapter`` (with an optional ``checksum`` of the folder, checked
before the adapter is served; SGLang has no such field) / ``/unload_lora_adapter``, ``GET /health``,
``/health_generate``, ``GET /server_info`` (``/get_server_info``: the context length and, in ``internal_states``,
the tokens generated so far), ``/v1/models``, and OpenAI ``POST /v1/chat/completions`` (``model="<served>"`` is
the base model, ``"<served>:<adapter>"`` an adapter) for user simulators and the router. Since the
protocol is SGLang's, :mod:`aclarena_slime.rollout` and everything else run against it unchanged.
:mod:`.sglang_server` adds what slime's external-engine mode needs on top of this app.

Requests in flight decode together on the model's worker thread (see :class:`MultiLoraModel`), so the
event loop keeps answering health checks, loads and aborts while they do; adapter loads and unloads
run on a thread of their own (an unload waits for the requests that hold the adapter).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.experts import ExpertError
from aclarena_slime.http_service import LOOPBACK, serving
from aclarena_slime.local.config import EngineSettings
from aclarena_slime.local.generation import (
    Generation,
    GenerationError,
    MultiLoraModel,
    Request,
    SamplingParams,
    UnknownAdapter,
)

SGLANG_VERSION = "0.5.15.post1"  # the SGLang release whose API the engine answers (slime 624b824's image)


class LocalEngine:
    """``async with open_engine(model_dir, served_name="tiny").serve() as url: ...`` (:func:`open_engine`)."""

    def __init__(self, model: MultiLoraModel, served_name: str = "local") -> None:
        self.model = model
        self.served_name = served_name
        self.chat = ChatTokens(model.tokenizer)
        self.generated_tokens = 0
        self.requests: dict[str, Request] = {}  # rid of each request queued or decoding
        self._executor: ThreadPoolExecutor | None = None

    @property
    def tokenizer(self) -> Any:
        """The served model's tokenizer (what a client encodes prompts with)."""
        return self.model.tokenizer

    def update_weights(self, state: dict[str, Any]) -> None:
        """Full fine-tuning's weight sync: the trained weights replace the served model's, in place (the local
        analogue of slime's weight update; a LoRA expert reaches the engine as an adapter folder instead)."""
        import torch

        with torch.no_grad():
            self.model.base.load_state_dict(state)

    def app(self, server_args: Callable[[], dict[str, Any]] = dict) -> web.Application:
        """The engine's HTTP app; ``server_args`` fills ``/server_info`` with SGLang's server arguments (the
        serve-engine's, :class:`~aclarena_slime.local.sglang_server.SGLangServer`)."""
        app = web.Application(client_max_size=64 * 1024 * 1024)

        async def server_info(request: web.Request) -> web.Response:
            return await self._server_info(server_args())

        for path in ("/server_info", "/get_server_info"):
            app.router.add_get(path, server_info)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/load_lora_adapter", self._load)
        app.router.add_post("/unload_lora_adapter", self._unload)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health_generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        return app

    @contextlib.asynccontextmanager
    async def serve(self, host: str = LOOPBACK, port: int = 0) -> AsyncIterator[str]:
        """Serve for the duration of the block; yields the base URL. Requests in flight are aborted at exit."""
        self.model.closing = False
        try:
            async with serving(self.app(), host, port) as url:
                yield url
        finally:
            self.model.closing = True
            await asyncio.get_running_loop().run_in_executor(None, self.model.wait_idle)
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-engine-lora")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def generate(
        self,
        input_ids: list[int],
        params: SamplingParams,
        adapter: str | None,
        rid: str | None = None,
        logprob_start: int | None = None,
    ) -> Generation:
        rid = rid or uuid.uuid4().hex
        request = self.model.submit(input_ids, params, adapter, logprob_start)
        self.requests[rid] = request
        try:
            result = await asyncio.wrap_future(request.future)
        except asyncio.CancelledError:  # the client went away: stop decoding for it
            request.aborted = True
            raise
        finally:
            if self.requests.get(rid) is request:
                del self.requests[rid]
        self.generated_tokens += len(result.output_ids)
        return result

    def abort(self, rid: str = "", abort_all: bool = False) -> None:
        """SGLang's abort: the named request (or all) stops at its next token with finish reason abort."""
        for key, request in list(self.requests.items()):
            if abort_all or key == rid:
                request.aborted = True

    # --- SGLang native API -------------------------------------------------------------------------

    async def _generate(self, request: web.Request) -> web.Response:
        payload = await _json_object(request)
        input_ids = payload.get("input_ids")
        if input_ids is None and isinstance(payload.get("text"), str):
            input_ids = self.chat.encode(payload["text"])
        if not isinstance(input_ids, list) or not all(isinstance(t, int) for t in input_ids):
            raise _bad_request("input_ids must be one list of token ids (or give 'text'); batches are not supported")
        lora = payload.get("lora_path")
        if lora is not None and not isinstance(lora, str):
            raise _bad_request("lora_path must be one adapter name")
        if lora is not None and lora not in self.model.adapters:  # SGLang: a ValueError, so 400
            loaded = sorted(self.model.adapters) or "none"
            raise _bad_request(f"The following requested LoRA adapters are not loaded: {lora}; loaded: {loaded}")
        rid = payload.get("rid")
        if rid is not None and not isinstance(rid, str):
            raise _bad_request("rid must be a string (one request id)")
        params = _params(payload.get("sampling_params"))
        start = None  # the first prompt position reported, when log-probs are asked for
        if payload.get("return_logprob"):
            unserved = [k for k in ("top_logprobs_num", "token_ids_logprob") if payload.get(k)]
            if unserved:  # refused rather than answered without them
                raise _bad_request(f"{unserved} are not served by the local engine (token log-probs only)")
            start = _logprob_start(payload.get("logprob_start_len"), len(input_ids), params.max_new_tokens == 0)
        rid = rid or uuid.uuid4().hex
        result = await _served(self.generate(input_ids, params, lora, rid, start))
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": result.finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(result.output_ids),
        }
        if start is not None:
            with_text = bool(payload.get("return_text_in_logprobs"))
            # SGLang's shape: from position K on, the first entry None (its logits are the position before K's).
            scores = [None, *result.input_log_probs] if start < len(input_ids) else []
            meta["input_token_logprobs"] = self._logprob_entries(scores, input_ids[start:], with_text)
            meta["output_token_logprobs"] = self._logprob_entries(result.log_probs, result.output_ids, with_text)
        return web.json_response({"text": self._text(result), "output_ids": result.output_ids, "meta_info": meta})

    def _logprob_entries(self, scores: list[float | None], ids: list[int], with_text: bool) -> list[list[Any]]:
        """``[logprob, token_id, text]`` each; the text (each token decoded alone) only with ``return_text_in_logprobs``."""
        texts = self.model.tokenizer.batch_decode([[t] for t in ids]) if with_text else [None] * len(ids)
        return [[lp, t, text] for lp, t, text in zip(scores, ids, texts, strict=True)]

    def _text(self, result: Generation) -> str:
        text = self.model.decode(result.output_ids)
        matched = result.finish.get("matched")
        if isinstance(matched, str) and text.endswith(matched):
            text = text[: -len(matched)]  # SGLang trims a matched stop string from the text (not the ids)
        return text

    async def _load(self, request: web.Request) -> web.Response:
        payload = await _json_object(request)
        name, path, checksum = payload.get("lora_name"), payload.get("lora_path"), payload.get("checksum")
        if not isinstance(name, str) or not isinstance(path, str):
            raise _invalid_body("load_lora_adapter needs lora_name and lora_path (strings)")
        if checksum is not None and not isinstance(checksum, str):
            raise _invalid_body("load_lora_adapter's checksum must be a string (adapter_swap.adapter_checksum)")
        try:
            return await self._lora_update(self.model.load_adapter, name, path, checksum)
        except Exception as exc:  # a damaged file: the reader's error names neither the file nor, often, the cause
            body = {"success": False, "error_message": f"cannot load adapter {name!r}: {_adapter_fault(path, exc)}"}
            return web.json_response({**body, "loaded_adapters": dict(self.model.adapters)}, status=400)

    async def _unload(self, request: web.Request) -> web.Response:
        payload = await _json_object(request)
        name = payload.get("lora_name")
        if not isinstance(name, str):
            raise _invalid_body("unload_lora_adapter needs lora_name (a string)")
        return await self._lora_update(self.model.unload_adapter, name)

    async def _lora_update(self, fn: Any, *args: Any) -> web.Response:
        """SGLang's LoRAUpdateOutput: ``success``, ``error_message``, ``loaded_adapters``; 400 on failure."""
        try:
            await self._run(fn, *args)
        except (GenerationError, ExpertError) as exc:
            body = {"success": False, "error_message": str(exc), "loaded_adapters": dict(self.model.adapters)}
            return web.json_response(body, status=400)
        return web.json_response({"success": True, "error_message": None, "loaded_adapters": dict(self.model.adapters)})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _server_info(self, server_args: dict[str, Any]) -> web.Response:
        """SGLang's ``/server_info``: the server arguments, the context length, the version and the engine's state
        (the tokens generated so far: what a stage's metrics read, over HTTP as from SGLang)."""
        return web.json_response({
            **server_args,
            "max_total_num_tokens": self.model.max_positions,
            "internal_states": [{"engine": "aclarena-local", "generated_tokens": self.generated_tokens}],
            "version": SGLANG_VERSION,
        })  # fmt: skip

    async def _health_generate(self, request: web.Request) -> web.Response:
        """As SGLang: generate one token, unless requests are in flight (then they prove the engine works)."""
        if not self.requests:
            await _served(self.generate([0], SamplingParams(temperature=0.0, max_new_tokens=1), None))
        return web.Response(text="")

    async def _models(self, request: web.Request) -> web.Response:
        names = [self.served_name] + [f"{self.served_name}:{a}" for a in sorted(self.model.adapters)]
        return web.json_response(
            {"object": "list", "data": [{"id": n, "object": "model", "owned_by": "aclarena-local"} for n in names]}
        )

    # --- OpenAI chat completions (user simulators, router) -------------------------------------------

    async def _chat_completions(self, request: web.Request) -> web.Response:
        body = await _json_object(request)
        if body.get("stream"):
            raise _bad_request("stream=true is not supported by the local engine")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad_request("messages must be a non-empty list")
        adapter = self._adapter_of_model(body.get("model"))
        raw: dict[str, Any] = {"temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0)}
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None:
            raw["max_new_tokens"] = max_tokens
        if body.get("stop") is not None:
            raw["stop"] = body["stop"]
        if body.get("seed") is not None:
            raw["sampling_seed"] = body["seed"]
        params = _params(raw)
        try:
            prompt = self.chat.prompt_ids(messages, body.get("tools"))
        except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
            raise _bad_request(f"cannot render messages with the chat template: {exc}") from exc
        result = await _served(self.generate(prompt, params, adapter))
        finish = {"stop": "stop", "length": "length"}.get(result.finish["type"], "abort")
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or self.served_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self._text(result)},
                        "finish_reason": finish,
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(result.output_ids),
                    "total_tokens": len(prompt) + len(result.output_ids),
                },
            }
        )

    def _adapter_of_model(self, model: Any) -> str | None:
        if model is None or model == self.served_name:
            return None
        if isinstance(model, str) and model.startswith(f"{self.served_name}:"):
            return model.split(":", 1)[1]
        known = [self.served_name] + [f"{self.served_name}:{a}" for a in sorted(self.model.adapters)]
        raise web.HTTPNotFound(
            text=_error_json(f"model {model!r} is not served here; known: {', '.join(known)}", 404),
            content_type="application/json",
        )


async def _served(awaitable: Any) -> Any:
    """Await engine work, turning the engine's own errors into 400 answers with the message."""
    try:
        return await awaitable
    except (GenerationError, ExpertError) as exc:
        raise _bad_request(str(exc), 404 if isinstance(exc, UnknownAdapter) else 400) from exc


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        payload = await request.json()
    except ValueError as exc:
        raise _invalid_body(f"the body is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise _invalid_body("the body must be a JSON object")
    return payload


def _logprob_start(raw: Any, prompt: int, scoring: bool) -> int:
    """SGLang's ``logprob_start_len`` for a prompt of ``prompt`` tokens: the first position reported.

    -1 (the default): none of the prompt for a scoring request (``max_new_tokens`` 0), its last token
    (always None) otherwise. SGLang refuses a start past the last prompt token for a request that
    generates, with this message; a scoring request may start at the end (nothing to report), and is
    refused past it here with the same message (SGLang does not check that case).
    """
    if raw is None or raw == -1:
        return prompt if scoring else prompt - 1
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise _bad_request(f"logprob_start_len must be -1 or a position in the prompt, got {raw!r}")
    if raw > prompt or (raw == prompt and not scoring):
        raise _bad_request(
            f"req.logprob_start_len={raw} is higher than the number of input tokens "
            f"len(req.origin_input_ids)={prompt}. Please use a smaller logprob_start_len."
        )
    return raw


def _params(raw: Any) -> SamplingParams:
    try:
        return SamplingParams.from_request(raw)
    except GenerationError as exc:
        raise _bad_request(str(exc)) from exc


def _error_json(message: str, status: int) -> str:
    import json

    return json.dumps({"error": {"message": message, "code": status}})


def _invalid_body(message: str) -> web.HTTPException:
    """A body that does not parse into the request type: SGLang (FastAPI) answers with ErrorResponse."""
    import json

    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return web.HTTPBadRequest(text=json.dumps(body), content_type="application/json")


def _bad_request(message: str, status: int = 400) -> web.HTTPException:
    cls = web.HTTPNotFound if status == 404 else web.HTTPBadRequest
    return cls(text=_error_json(message, status), content_type="application/json")


def _adapter_fault(path: str, exc: Exception) -> str:
    """Which file of the PEFT folder at ``path`` is damaged and how, found by reading each one again (only
    after a load failed): the config as JSON, then the weights as safetensors."""
    config = Path(path) / "adapter_config.json"
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as bad:
        return f"{config}: {type(bad).__name__}: {bad}"
    weights = Path(path) / "adapter_model.safetensors"
    if weights.is_file():
        from safetensors.torch import load_file

        try:
            load_file(str(weights))
        except Exception as bad:  # safetensors raises its own SafetensorError (and OSError)
            return f"{weights}: {type(bad).__name__}: {bad}"
    return f"{path}: {type(exc).__name__}: {exc}"


def open_engine(
    model_dir: str | Path,
    *,
    seed: int = 0,
    settings: EngineSettings | None = None,
    served_name: str = "local",
    adapters: Mapping[str, str | Path] | None = None,
) -> LocalEngine:
    """The one way the library builds the embedded engine (a stage, parallel MLE, the arena's evaluation,
    ``aclarena eval --local-model`` and ``aclarena local serve-engine``): the Hugging Face model in
    ``model_dir`` with ``adapters`` (name -> PEFT folder) loaded before it serves."""
    model = MultiLoraModel.from_pretrained(model_dir, seed=seed, settings=settings)
    for name, path in (adapters or {}).items():
        model.load_adapter(name, path)
    return LocalEngine(model, served_name=served_name)
