"""The agent loop under engine and env faults: SGLang's own words for a missing adapter, an env that cannot start."""

from __future__ import annotations

import pytest
from aiohttp import web

from aclarena_slime.agent_loop import ABORTED, FAILED, LoopSettings, run_episode
from aclarena_slime.chat_tokens import ChatTokens
from aclarena_slime.http_service import serving
from aclarena_slime.plugin.contract import Conversation, Environment, Episode, EpisodeAborted, Score, Task
from aclarena_slime.sglang_client import RetryPolicy, SGLangClient, SGLangError

ONCE = RetryPolicy(attempts=1)

# SGLang 0.5.15, python/sglang/srt/managers/tokenizer_manager.py (_resolve_lora_path), answered by http_server's
# _create_error_response as 400 {"error": {"message": str(e)}}.
NEVER_LOADED = "Got LoRA adapter that has never been loaded: search@3\nAll loaded adapters: dict_keys(['search@4'])."
RELOAD_FAILED = "Failed to implicitly load LoRA adapter search@3: LoRA adapter search@3 does not exist"


class OneTurn(Episode):
    conversation = Conversation([{"role": "user", "content": "hi"}])

    async def step(self, text):
        raise AssertionError("the engine refused the turn; the env is never stepped")

    async def score(self):
        return Score(1.0)


class OneTurnEnv(Environment):
    tag = "one-turn"

    async def start(self, task):
        return OneTurn()


def _refusing(message: str) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": message}}, status=400)

    app = web.Application()
    app.router.add_post("/generate", generate)
    return app


@pytest.mark.parametrize("message", [NEVER_LOADED, RELOAD_FAILED])
async def test_sglangs_words_for_a_retired_adapter_end_the_pinned_episode(tiny_tokenizer, message):
    settings = LoopSettings(max_response_tokens=8, lora_path="search@3")
    async with serving(_refusing(message)) as url:
        traj = await run_episode(
            OneTurnEnv(), Task("p"), SGLangClient(url, retry=ONCE), ChatTokens(tiny_tokenizer), {}, settings
        )
    assert (traj.status, traj.end_reason) == (ABORTED, "adapter_retired") and message in (traj.error or "")


async def test_other_engine_refusals_still_fail_the_rollout_naming_the_engine(tiny_tokenizer):
    settings = LoopSettings(max_response_tokens=8, lora_path="search@3")
    async with serving(_refusing("The input (9000 tokens) is longer than the model's context length")) as url:
        with pytest.raises(SGLangError, match="context length") as info:
            await run_episode(OneTurnEnv(), Task("p"), SGLangClient(url, retry=ONCE), ChatTokens(tiny_tokenizer), {},
                              settings)  # fmt: skip
    assert url in str(info.value)


@pytest.mark.parametrize("failure", [RuntimeError("index file missing"), EpisodeAborted("retriever unreachable")])
async def test_an_env_that_cannot_start_still_fills_the_prompt_tokens(tiny_tokenizer, failure):
    class Broken(Environment):
        tag = "broken-start"

        async def start(self, task):
            raise failure

    chat = ChatTokens(tiny_tokenizer)
    traj = await run_episode(Broken(), Task("What is 2 + 2?"), SGLangClient("http://127.0.0.1:9"), chat, {},
                             LoopSettings(max_response_tokens=8))  # fmt: skip
    assert traj.status == (FAILED if isinstance(failure, RuntimeError) else ABORTED)
    assert traj.prompt_ids == chat.prompt_ids([{"role": "user", "content": "What is 2 + 2?"}])
    assert traj.tokens == traj.prompt_ids and traj.response_ids == [] and traj.loss_mask == []
