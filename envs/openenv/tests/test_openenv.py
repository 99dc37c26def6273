"""The OpenEnv bridge against a real OpenEnv server (openenv-core's create_app, served by uvicorn on loopback): an
episode is a session of reset / step, the reward is the episode's, refused actions are observations, and a server
that is gone or dies mid-episode aborts the sample with the reason instead of crashing the rollout."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core.env_server.http_server")

from aclarena_envs.openenv import data  # noqa: E402
from aclarena_envs.openenv.env import LoopbackServer, OpenEnvEnvironment  # noqa: E402
from aclarena_slime.agent_loop import ABORTED, COMPLETED, LoopSettings, run_episode  # noqa: E402
from aclarena_slime.chat_tokens import ChatTokens  # noqa: E402
from aclarena_slime.local.demos import ScriptedClient  # noqa: E402
from aclarena_slime.plugin.conformance import check_environment, check_hostile_outputs  # noqa: E402
from aclarena_slime.plugin.contract import Done, EpisodeAborted, Observation, Task  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
APP = "aclarena_envs.openenv.example:app"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve() -> tuple[subprocess.Popen, str]:
    """The example OpenEnv server on a free loopback port, once it answers /health."""
    server = LoopbackServer(APP, 90.0)
    return server.process, server.url


def stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait(timeout=10)


@pytest.fixture(scope="module")
def server():
    process, url = serve()
    yield url
    stop(process)


def env(url: str, **config) -> OpenEnvEnvironment:
    return OpenEnvEnvironment({"url": url, "observation_field": "feedback", **config})


def secret(seed: int) -> int:
    import random

    from aclarena_envs.openenv.example import HIGHEST

    return random.Random(seed).randint(1, HIGHEST)


async def test_an_episode_is_a_session_and_its_reward_the_episodes(server):
    environment = env(server)
    record = environment.demo_records(1, seed=4)[0]
    answer = secret(record["metadata"]["reset"]["seed"])
    episode = await environment.start(Task(**record))
    try:
        assert episode.conversation.messages[0]["content"].endswith("I picked a number from 1 to 50. Reply with your guess, a number.")
        low = answer - 1 if answer > 1 else answer + 1
        assert await episode.step(f"<think>start low</think>{low}") == Observation(
            [{"role": "user", "content": "Higher." if low < answer else "Lower."}]
        )
        assert isinstance(await episode.step(str(answer)), Done)
        score = await episode.score()
    finally:
        await episode.close()
    assert (score.reward, score.breakdown["steps"], score.breakdown["done"]) == (1.0, 2, True)


async def test_a_refused_action_is_an_observation(server):
    environment = env(server, action="json")
    episode = await environment.start(Task(**environment.demo_records(1)[0]))
    try:
        refused = await episode.step('{"guess": 3}')  # the action schema has "message", and forbids other fields
        assert refused.messages[0]["content"].startswith("Invalid action:")
        assert (await episode.step("not json")).messages[0]["content"].startswith("Your action must be a JSON object")
        assert isinstance(await episode.step('{"message": "3"}'), (Observation, Done))
        score = await episode.score()
    finally:
        await episode.close()
    assert score.breakdown["refused_actions"] == 1 and score.breakdown["steps"] == 1


async def test_through_the_agent_loop_observations_are_masked(server, tiny_tokenizer):
    chat = ChatTokens(tiny_tokenizer)
    environment = env(server)
    record = environment.demo_records(1, seed=2)[0]
    answer = secret(record["metadata"]["reset"]["seed"])
    wrong = 1 if answer != 1 else 2
    engine = ScriptedClient(chat, [str(wrong), str(answer)], chat.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    traj = await run_episode(environment, Task(**record), engine, chat, {}, LoopSettings(max_response_tokens=256))
    assert traj.status == COMPLETED and traj.end_reason == "env_done" and traj.score.reward == 1.0
    assert traj.turns == [str(wrong), str(answer)] and 0 in traj.loss_mask
    assert traj.messages[2]["content"] in ("Higher.", "Lower.")


@pytest.mark.slow
async def test_a_server_that_is_gone_or_dies_aborts_the_sample(tiny_tokenizer):
    chat = ChatTokens(tiny_tokenizer)
    closed = f"http://127.0.0.1:{free_port()}"
    engine = ScriptedClient(chat, ["1"], chat.tokenizer.convert_tokens_to_ids("<|im_end|>"))
    task = Task(**data.records(1)[0])
    traj = await run_episode(env(closed), task, engine, chat, {}, LoopSettings(max_response_tokens=64))
    assert traj.status == ABORTED and "cannot be reached" in traj.error

    process, url = serve()
    try:
        environment = env(url)
        episode = await environment.start(task)
        stop(process)
        with pytest.raises(EpisodeAborted, match="OpenEnv session"):
            await episode.step("7")
        await episode.close()
    finally:
        if process.poll() is None:
            stop(process)


async def test_conforms_and_survives_hostile_turns(server):
    environment = env(server)
    tasks = [Task(**r) for r in environment.demo_records(2, seed=1)]
    await check_environment(environment, tasks, ["25", "<think>hm</think> 10"])
    await check_hostile_outputs(environment, tasks[:1], examples=10)


@pytest.mark.slow
async def test_an_env_that_serves_its_own_server_starts_and_stops_it():
    environment = OpenEnvEnvironment({"serve": APP, "observation_field": "feedback"})
    try:
        episode = await environment.start(Task(**environment.demo_records(1)[0]))
        assert "Episode 0." in episode.conversation.messages[0]["content"]
        assert isinstance(await episode.step("25"), (Observation, Done))
        await episode.close()
        server = environment._server
        assert server is not None and server.alive()
    finally:
        await environment.aclose()
    assert not server.alive()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="url must be"):
        OpenEnvEnvironment({})
    with pytest.raises(ValueError, match=r"unknown config keys of the openenv env \['urls'\]"):
        OpenEnvEnvironment({"urls": "http://x"})
    with pytest.raises(ValueError, match="action must be text or json"):
        OpenEnvEnvironment({"url": "http://x", "action": "yaml"})


def test_prepare_writes_one_record_per_episode(tmp_path):
    out = tmp_path / "train.jsonl"
    assert data.main(["--output", str(out), "--n", "3", "--seed", "1"]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == data.records(3, 1) and len({r["metadata"]["reset"]["seed"] for r in written}) == 3


def test_a_slime_stage_compiles_with_the_server_as_its_service(tmp_path, capsys):
    from aclarena_slime.launcher.stage import main

    assert main([str(REPO / "recipes" / "openenv.yaml"), "--dry-run", "backend=slime", f"paths.root={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert f"# service openenv at http://127.0.0.1:8010 (watched, at most 2 restarts): {sys.executable} -m uvicorn {APP}" in out
    assert '"url": "http://127.0.0.1:8010"' in out
