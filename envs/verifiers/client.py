"""The model side of a bridged verifiers rollout: a ``verifiers`` client whose answers come from our agent loop.

verifiers drives its rollout by asking a client for each model turn (``Client.get_response(prompt, tools)``).
Here that call does not reach a server: it hands the request (the messages so far, the tools) to the
episode and waits for the turn our agent loop generated, token-in/token-out through the engine, with the
chat template applied once, by us. The episode turns the text back into what an OpenAI-compatible server
would answer (content, reasoning, tool calls), so the env's parser, tools and rubric see what they expect.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from verifiers.clients import Client
from verifiers.types import Response, ResponseMessage, ToolCall

from aclarena_envs.retail.tool_calls import MalformedCall, ToolCallParser

THINK_END = "</think>"


def response_of(text: str, model: str, turn: int, parser: ToolCallParser) -> Response:
    """The model's turn as a chat-completions answer: thinking as ``reasoning_content``, the rest as content, and
    each ``<tool_call>`` as a tool call (one that cannot be read keeps its error as arguments that are not JSON,
    which verifiers' ToolEnv answers with the parse error, as a server's malformed call would get)."""
    thinking, _, _ = text.rpartition(THINK_END)
    parsed = parser.parse(text)
    calls = []
    for i, call in enumerate(parsed.calls):
        call_id = f"call_{turn}_{i}"
        if isinstance(call, MalformedCall):
            calls.append(ToolCall(id=call_id, name="", arguments=call.error))
        else:
            calls.append(ToolCall(id=call_id, name=call.name, arguments=json.dumps(call.arguments, ensure_ascii=False)))
    message = ResponseMessage(
        content=parsed.content,
        reasoning_content=thinking.replace("<think>", "", 1).strip() or None,
        tool_calls=calls or None,
        finish_reason="tool_calls" if calls else "stop",
        is_truncated=False,
    )
    return Response(id=f"aclarena-{turn}", created=int(time.time()), model=model, message=message)


class LoopClient(Client):
    """Each ``get_response`` posts ``(prompt, tools)`` on :attr:`requests` and waits for :meth:`answer`."""

    def __init__(self) -> None:
        super().__init__(None)
        self.requests: asyncio.Queue[tuple[list[Any], list[Any] | None]] = asyncio.Queue()
        self.pending: asyncio.Future[Response] | None = None

    async def get_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **_: Any) -> Response:
        self.pending = asyncio.get_running_loop().create_future()
        self.requests.put_nowait((list(prompt), tools))
        return await self.pending

    def answer(self, response: Response) -> None:
        if self.pending is not None and not self.pending.done():
            self.pending.set_result(response)

    def stop(self, error: BaseException) -> None:
        """End the rollout's wait for a turn that will not come (the loop's turn or token limit)."""
        if self.pending is not None and not self.pending.done():
            self.pending.set_exception(error)

    # The transport methods of verifiers' Client: unused, get_response above never reaches a server.
    def setup_client(self, config: Any) -> None:
        return None

    async def to_native_tool(self, tool: Any) -> Any:
        return tool

    async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
        return messages, {}

    async def get_native_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **kwargs: Any) -> Any:
        raise NotImplementedError("the loop client answers in get_response")

    async def raise_from_native_response(self, response: Any) -> None:
        return None

    async def from_native_response(self, response: Any) -> Response:
        return response

    async def close(self) -> None:
        return None
