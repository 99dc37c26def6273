"""``openenv``: an episode driven through an OpenEnv environment server (``reset`` / ``step``), its reward the episode's.

An OpenEnv environment is a server (``openenv.core.env_server.create_app``); its episode is a session: the
WebSocket ``{url}/ws`` that OpenEnv's own ``EnvClient`` opens, one per episode, with ``reset`` / ``step`` /
``close`` messages. (The plain ``POST /reset`` and ``POST /step`` endpoints build a fresh environment per
request, so they cannot carry an episode.) The first observation, after the record's prompt (or the
``instruction``), is the conversation; each model turn (after any thinking) is an action: the text in
``action_field`` (plus the fixed ``action_extra`` fields), or with ``action: json`` the JSON object the model
wrote; each next observation is a user message until the server says ``done``. The reward is the sum (or the
last, ``reward: last``) of the step rewards, clamped to ``reward_range``.

An action the server refuses (its schema's validation error) is an observation the model sees; a server that
cannot be reached, dies, errs while stepping, or does not answer within ``timeout_s`` aborts the sample with
the reason (EpisodeAborted: never trained on). The server runs at ``url``, or the stage starts it as a service
(``recipes/service/openenv.yaml``), or the env starts it itself on loopback (``serve: module:app``, what the
local backend does, which starts no services) and stops it in ``aclose``. No openenv package is needed on this
side: the protocol is JSON over a WebSocket (aiohttp).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import aiohttp

from aclarena_slime.plugin.contract import (
    Conversation,
    Done,
    Environment,
    Episode,
    EpisodeAborted,
    Observation,
    Score,
    Task,
)
from aclarena_slime.plugin.settings import from_mapping

TAG = "openenv"
_SURROGATE = re.compile("[\ud800-\udfff]")
_REFUSED = "VALIDATION_ERROR"  # OpenEnv's WSErrorCode for an action its schema refuses: the model's doing


@dataclass(frozen=True)
class OpenEnvConfig:
    """The env's settings (recipe ``env_config.openenv``)."""

    url: str = ""  # http://host:port of the OpenEnv server
    serve: str | None = None  # "module:app": the env starts this server itself on loopback (the local backend)
    serve_timeout_s: float = 120.0
    instruction: str = "You act in an environment. Each of your replies is one action."
    action: str = "text"  # "text": the turn in action_field | "json": the turn is the action object
    action_field: str = "message"
    action_extra: Mapping[str, Any] = field(default_factory=dict)
    observation_field: str | None = None  # the observation's field the model sees; None: the observation as JSON
    reward: str = "sum"  # "sum" of the step rewards | "last"
    reward_range: tuple[float, float] = (0.0, 1.0)
    max_turns: int = 8
    max_action_chars: int = 4000
    max_observation_chars: int = 4000
    timeout_s: float = 30.0


class OpenEnvEpisode(Episode):
    def __init__(self, env: OpenEnvEnvironment, task: Task) -> None:
        self.env, self.s, self.task = env, env.settings, task
        self.rewards: list[float] = []
        self.done, self.refused = False, 0
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def begin(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.s.timeout_s))
        url = await self.env.server_url()
        ws_url = re.sub(r"^http", "ws", url.rstrip("/")) + "/ws"
        try:
            self.ws = await asyncio.wait_for(self.session.ws_connect(ws_url), self.s.timeout_s)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise EpisodeAborted(f"the OpenEnv server at {url} cannot be reached: {type(exc).__name__}: {exc}") from exc
        reset = dict(self.task.metadata.get("reset") or {})
        kind, data = await self._call({"type": "reset", "data": reset})
        if kind != "observation":
            raise EpisodeAborted(f"the OpenEnv server refused reset: {_message(data)}")
        prompt = self.task.prompt if isinstance(self.task.prompt, str) else ""
        self._observed(data)
        text = "\n\n".join(p for p in (self.s.instruction, prompt, self._render(data)) if p)
        self.conversation = Conversation([{"role": "user", "content": text}])

    async def step(self, text: str) -> Observation | Done:
        if self.done:
            return Done("env_done")
        action = self._action(text.rsplit("</think>", 1)[-1].strip())
        if isinstance(action, str):  # what the model wrote is no action: it sees why
            return Observation([{"role": "user", "content": action}])
        kind, data = await self._call({"type": "step", "data": action})
        if kind == "error" and data.get("code") == _REFUSED:
            self.refused += 1
            return Observation([{"role": "user", "content": f"Invalid action: {_message(data)}"}])
        if kind != "observation":
            raise EpisodeAborted(f"the OpenEnv server failed to step: {_message(data)}")
        self._observed(data)
        if self.done:
            return Done("env_done")
        return Observation([{"role": "user", "content": self._render(data)}])

    async def score(self) -> Score:
        total = (self.rewards[-1] if self.rewards else 0.0) if self.s.reward == "last" else sum(self.rewards)
        low, high = self.env.reward_range
        reward = min(max(total, low), high) if total == total else low
        return Score(reward, {"episode_reward": total, "steps": len(self.rewards), "done": self.done,
                              "refused_actions": self.refused, "rewards": self.rewards[-50:]})  # fmt: skip

    async def close(self) -> None:
        try:
            if self.ws is not None and not self.ws.closed:
                await asyncio.wait_for(self.ws.send_str(json.dumps({"type": "close"})), 1.0)
                await asyncio.wait_for(self.ws.close(), 1.0)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, RuntimeError):
            pass  # the server went away first: nothing left to close there
        finally:
            if self.session is not None:
                await self.session.close()

    def _action(self, visible: str) -> dict[str, Any] | str:
        """The action for the model's turn, or (a str) what the model is told instead."""
        if len(visible) > self.s.max_action_chars:
            return f"Your action is longer than {self.s.max_action_chars} characters; nothing was done."
        visible = _SURROGATE.sub("\ufffd", visible)
        if self.s.action == "text":
            return {**self.s.action_extra, self.s.action_field: visible}
        try:
            action = json.loads(visible)
        except (ValueError, RecursionError) as exc:
            return f"Your action must be a JSON object ({str(exc)[:200]}); nothing was done."
        if not isinstance(action, dict):
            return "Your action must be a JSON object; nothing was done."
        return {**self.s.action_extra, **action}

    async def _call(self, message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """One request of the session and its answer: ``(type, data)``; a dead or silent server aborts."""
        assert self.ws is not None
        try:
            await asyncio.wait_for(self.ws.send_str(json.dumps(message)), self.s.timeout_s)
            reply = await asyncio.wait_for(self.ws.receive(), self.s.timeout_s)
        except asyncio.TimeoutError as exc:
            raise EpisodeAborted(f"the OpenEnv server did not answer {message['type']} within {self.s.timeout_s:g} s") from exc
        except (aiohttp.ClientError, OSError, RuntimeError) as exc:
            raise EpisodeAborted(f"the OpenEnv session broke during {message['type']}: {type(exc).__name__}: {exc}") from exc
        if reply.type != aiohttp.WSMsgType.TEXT:
            raise EpisodeAborted(f"the OpenEnv session closed during {message['type']} ({reply.type.name})")
        try:
            body = json.loads(reply.data)
            return str(body.get("type", "")), dict(body.get("data") or {})
        except (ValueError, TypeError, AttributeError) as exc:
            raise EpisodeAborted(f"the OpenEnv server answered {message['type']} with no JSON message: {exc}") from exc

    def _observed(self, data: Mapping[str, Any]) -> None:
        reward = data.get("reward")
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            self.rewards.append(float(reward))
        self.done = bool(data.get("done"))

    def _render(self, data: Mapping[str, Any]) -> str:
        observation = data.get("observation")
        if self.s.observation_field is not None and isinstance(observation, Mapping):
            text = str(observation.get(self.s.observation_field, ""))
        else:
            text = json.dumps(observation, ensure_ascii=False, default=str)
        return _SURROGATE.sub("\ufffd", text[: self.s.max_observation_chars])


class LoopbackServer:
    """``python -m uvicorn APP`` on a free loopback port, up once it answers ``/health``; its log in a file (a
    pipe nobody reads fills up and stalls the server)."""

    def __init__(self, app: str, timeout_s: float) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile()
        command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise OSError(f"it exited ({self.process.returncode}): {self.log.read().decode(errors='replace')[-1000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1.0):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise OSError(f"no answer on {self.url}/health within {timeout_s:g} s")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()


def _message(data: Mapping[str, Any]) -> str:
    return str(data.get("message") or data.get("errors") or data)[:300]


class OpenEnvEnvironment(Environment):
    tag: ClassVar[str] = TAG
    prepare_data: ClassVar[str | None] = "aclarena_envs.openenv.data.main"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.settings = from_mapping(OpenEnvConfig, self.config, "config keys of the openenv env")
        s = self.settings
        if not s.serve and not s.url.startswith(("http://", "https://")):
            raise ValueError(f"openenv: url must be the server's http(s)://host:port (or serve a module:app), got {s.url!r}")
        if s.action not in ("text", "json") or s.reward not in ("sum", "last"):
            raise ValueError(f"openenv: action must be text or json and reward sum or last, got {s.action!r}, {s.reward!r}")
        low, high = (float(x) for x in s.reward_range)
        if not low < high or s.max_turns < 1 or not s.timeout_s > 0:
            raise ValueError("openenv: reward_range must be [low, high] with low < high, max_turns and timeout_s positive")
        self.reward_range = (low, high)
        self.max_turns = s.max_turns
        self._server: LoopbackServer | None = None
        self._serving = asyncio.Lock()

    async def server_url(self) -> str:
        """``url``, or the loopback server this env starts on first use when ``serve`` names one."""
        if not self.settings.serve:
            return self.settings.url
        async with self._serving:
            if self._server is None or not self._server.alive():
                try:
                    self._server = await asyncio.to_thread(LoopbackServer, self.settings.serve, self.settings.serve_timeout_s)
                except OSError as exc:
                    raise EpisodeAborted(f"the OpenEnv server {self.settings.serve} did not start: {exc}") from exc
            return self._server.url

    async def aclose(self) -> None:
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)
            self._server = None

    async def start(self, task: Task) -> OpenEnvEpisode:
        episode = OpenEnvEpisode(self, task)
        try:
            await episode.begin()
        except BaseException:
            await episode.close()
            raise
        return episode

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        from aclarena_envs.openenv.data import records

        return records(n, seed, self.tag)
