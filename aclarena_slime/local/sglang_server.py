"""The local engine as an SGLang server: what slime's external-engine mode and its rollout call.

``aclarena local serve-engine --model DIR`` serves this, so that slime's own ``train.py`` (run with
``--debug-rollout-only --rollout-external-engine-addrs HOST:PORT``) can roll out on a CPU. On top of
:class:`~aclarena_slime.local.engine.LocalEngine`'s app (``/generate``, LoRA load/unload, health,
OpenAI chat) it answers, with SGLang 0.5.15's names and shapes:

- ``GET /server_info`` (and the deprecated ``/get_server_info``; the engine's app answers it): the server
  arguments. Slime compares some of them with what it would have launched; ``enable_memory_saver`` must be
  false for an external engine (``slime/backends/sglang_utils/sglang_engine.py``, ``_init_external``).
- ``GET /model_info`` (``/get_model_info``), ``GET /v1/loads`` (``/get_load``), ``POST /abort_request``
  (``rid`` or ``abort_all``), ``GET|POST /flush_cache``, ``GET /weight_version`` is SGLang's 404.

Errors keep SGLang's shapes: a body that does not parse gets FastAPI's ``ErrorResponse``
(``{"object": "error", "message", "type", "param", "code"}``), a request the engine refuses gets
``{"error": {"message"}}`` (``_create_error_response``), a failed LoRA update
``{"success": false, "error_message", "loaded_adapters"}``, an unknown path ``ErrorResponse`` with 404.
An adapter request is answered in SGLang's words (:mod:`aclarena_slime.sglang_errors`): a name this
server never loaded, one whose remembered folder is gone, an unload of a name it does not hold. (SGLang
would reload a remembered adapter whose folder is still there; this server does not, and says so in its
engine's words.)

Every call is logged as one line ``[engine] METHOD PATH STATUS`` (on stderr), so a smoke run can list
what slime called; :attr:`SGLangServer.calls` counts them.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

from aclarena_slime import sglang_errors
from aclarena_slime.local.engine import SGLANG_VERSION, LocalEngine

CALL_PREFIX = "[engine] "


class SGLangServer:
    """``SGLangServer(engine, model_path="/models/tiny").app()``: the engine's app plus SGLang's server API."""

    def __init__(
        self, engine: LocalEngine, model_path: str | Path, host: str, port: int, log: TextIO | None = None
    ) -> None:
        self.engine = engine
        self.model_path = str(model_path)
        self.host, self.port = host, port
        self.log = log if log is not None else sys.stderr
        self.calls: Counter[str] = Counter()
        self.started = time.time()
        self.remembered: dict[str, str] = {}  # every adapter loaded: SGLang's lora_ref_cache

    def app(self) -> web.Application:
        app = self.engine.app(server_args=self.server_args)
        app.middlewares.append(self._log_and_shape)
        for path in ("/model_info", "/get_model_info"):
            app.router.add_get(path, self._model_info)
        app.router.add_get("/v1/loads", self._loads)
        app.router.add_get("/get_load", self._get_load)
        app.router.add_post("/abort_request", self._abort)
        app.router.add_route("GET", "/flush_cache", self._flush_cache)
        app.router.add_route("POST", "/flush_cache", self._flush_cache)
        return app

    def server_args(self) -> dict[str, Any]:
        """The SGLang ``ServerArgs`` fields that describe this engine (names as ``dataclasses.asdict`` gives)."""
        model = self.engine.model
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.engine.served_name,
            "host": self.host,
            "port": self.port,
            "device": "cpu",
            "dtype": "float32",
            "context_length": model.max_positions,
            "tp_size": 1,
            "pp_size": 1,
            "dp_size": 1,
            "ep_size": 1,
            "nnodes": 1,
            "node_rank": 0,
            "enable_memory_saver": False,
            "enable_lora": True,
            "lora_paths": dict(model.adapters),
            "max_loras_per_batch": model.settings.max_running_requests,
            "max_running_requests": model.settings.max_running_requests,
            "max_prefill_tokens": model.settings.max_prefill_tokens,
            "disaggregation_mode": "null",
            "skip_server_warmup": True,
            "enable_metrics": False,
            "random_seed": None,
        }

    # --- handlers ----------------------------------------------------------------------------------

    async def _model_info(self, request: web.Request) -> web.Response:
        config = self.engine.model.base.config
        return web.json_response(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": getattr(config, "model_type", None),
                "architectures": getattr(config, "architectures", None),
            }
        )

    def load(self) -> dict[str, Any]:
        """One rank's load, as ``/v1/loads`` reports it."""
        model = self.engine.model
        return {
            "dp_rank": 0,
            "num_running_reqs": model.num_running,
            "num_waiting_reqs": model.num_waiting,
            "num_total_tokens": model.max_positions or 0,
            "num_used_tokens": model.used_tokens,
        }

    async def _loads(self, request: web.Request) -> web.Response:
        dp_rank = request.query.get("dp_rank")
        if dp_rank is not None and dp_rank != "0":
            return _http_error(400, f"dp_rank {dp_rank} is out of range: this engine has one rank (0)")
        if request.query.get("format") == "prometheus":
            lines = [f'sglang_{k}{{dp_rank="0"}} {v}' for k, v in self.load().items() if k != "dp_rank"]
            return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
        return web.json_response(
            {"timestamp": datetime.now(UTC).isoformat(), "version": SGLANG_VERSION, "loads": [self.load()]}
        )

    async def _get_load(self, request: web.Request) -> web.Response:
        load = self.load()
        return web.json_response(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
                    "num_waiting_reqs": load["num_waiting_reqs"],
                    "num_tokens": load["num_total_tokens"],
                    "num_pending_tokens": load["num_total_tokens"] - load["num_used_tokens"],
                    "ts_tic": time.perf_counter(),
                }
            ]
        )

    async def _abort(self, request: web.Request) -> web.Response:
        try:
            payload = await request.json()
        except ValueError as exc:
            return _http_error(400, f"the body is not JSON: {exc}", validation=True)
        if not isinstance(payload, dict):
            return _http_error(400, "the body must be a JSON object (AbortReq)", validation=True)
        rid, abort_all = payload.get("rid"), payload.get("abort_all", False)
        if (rid is not None and not isinstance(rid, str)) or not isinstance(abort_all, bool):
            return _http_error(400, "AbortReq: rid must be a string and abort_all a boolean", validation=True)
        self.engine.abort(rid or "", abort_all)
        return web.Response(status=200)

    async def _flush_cache(self, request: web.Request) -> web.Response:
        # The engine keeps no cache between requests (a sequence's KV rows go with it): nothing to flush.
        return web.Response(
            text="Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n"
        )

    # --- every request --------------------------------------------------------------------------------

    @web.middleware
    async def _log_and_shape(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        status = 500
        try:
            response = await self._adapter_refusal(request) or await handler(request)
            status = response.status
            if request.path == "/load_lora_adapter" and status == 200:
                body = await request.json()
                self.remembered[body["lora_name"]] = body["lora_path"]
            return response
        except web.HTTPException as exc:
            status = exc.status
            if exc.content_type == "application/json":
                raise
            # aiohttp's own answers (unknown path, wrong method) in FastAPI's ErrorResponse shape.
            return _http_error(exc.status, exc.reason)
        finally:
            self.calls[f"{request.method} {request.path}"] += 1
            print(f"{CALL_PREFIX}{request.method} {request.path} {status}", file=self.log, flush=True)


    async def _adapter_refusal(self, request: web.Request) -> web.Response | None:
        """SGLang 0.5.15's answer to a generate naming an adapter not loaded, or an unload of one not held."""
        if request.path not in ("/generate", "/unload_lora_adapter") or request.method != "POST":
            return None
        try:
            body = await request.json()
        except ValueError:
            return None  # the engine's own validation answers
        loaded = list(self.engine.model.adapters)
        if request.path == "/unload_lora_adapter":
            name = body.get("lora_name") if isinstance(body, dict) else None
            if not isinstance(name, str) or name in loaded:
                return None
            message = sglang_errors.unload_unknown(name, loaded)
            return web.json_response({"success": False, "error_message": message, "loaded_adapters": None}, status=400)
        name = body.get("lora_path") if isinstance(body, dict) else None
        if not isinstance(name, str):
            return None
        message = sglang_errors.resolve_request(name, loaded, self.remembered)
        return None if message is None else web.json_response({"error": {"message": message}}, status=400)


def _http_error(status: int, message: str, validation: bool = False) -> web.Response:
    """FastAPI's answer in SGLang: ``ErrorResponse`` (type "Bad Request" for a body that does not parse)."""
    body = {
        "object": "error",
        "message": message,
        "type": "Bad Request" if validation else str(status),
        "param": None,
        "code": status,
    }
    return web.json_response(body, status=status)


def called_endpoints(log_text: str) -> Counter[str]:
    """``METHOD PATH`` -> count, read back from a server log (the lines :class:`SGLangServer` prints)."""
    out: Counter[str] = Counter()
    for line in log_text.splitlines():
        if line.startswith(CALL_PREFIX):
            method, path, _status = line[len(CALL_PREFIX) :].split(" ", 2)
            out[f"{method} {path}"] += 1
    return out


def serve(engine: LocalEngine, model_path: str | Path, host: str, port: int) -> None:
    """Blocking: serve until SIGINT/SIGTERM (``aclarena local serve-engine``)."""
    server = SGLangServer(engine, model_path, host, port)
    app = server.app()

    async def stop_decoding(app: web.Application) -> None:
        engine.model.closing = True  # a request mid-decode ends with finish reason abort

    app.on_shutdown.append(stop_decoding)
    print(
        f"[serve-engine] serving {model_path} as an SGLang {SGLANG_VERSION} server at http://{host}:{port}", flush=True
    )
    web.run_app(app, host=host, port=port, access_log=None, print=None)
