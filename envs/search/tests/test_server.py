"""The /retrieve server speaks Search-R1's API; RemoteRetriever and the env use it as a client would."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from aclarena_envs.search.demo_corpus import generate
from aclarena_envs.search.env import SearchEnvironment
from aclarena_envs.search.retriever import BM25Retriever, RemoteRetriever, RetrieverError
from aclarena_envs.search.server import make_app
from aclarena_slime.http_service import serving
from aclarena_slime.plugin.contract import EpisodeAborted, Observation, Task

DEMO = generate(60, seed=2)
RETRIEVER = BM25Retriever.from_documents(DEMO.passages)


@pytest.fixture
async def url():
    async with serving(make_app(RETRIEVER, default_topk=2)) as base:
        yield f"{base}/retrieve"


async def _post(url, body=None, raw=None):
    kwargs = {"data": raw} if raw is not None else {"json": body}
    async with aiohttp.ClientSession() as s, s.post(url, **kwargs) as resp:
        return resp.status, await resp.json()


async def test_search_r1_request_gets_search_r1_response_with_scores(url):
    queries = [DEMO.questions[0].question, DEMO.questions[1].question]
    status, body = await _post(url, {"queries": queries, "topk": 3, "return_scores": True})
    assert status == 200 and list(body) == ["result"] and len(body["result"]) == 2
    expected = RETRIEVER.search(queries, 3)
    for row, hits in zip(body["result"], expected, strict=True):
        assert [item["document"] for item in row] == [dict(h.document) for h in hits]
        assert [item["score"] for item in row] == pytest.approx([h.score for h in hits])
        assert all(set(item) == {"document", "score"} and set(item["document"]) == {"id", "contents"} for item in row)


async def test_without_scores_items_are_bare_documents_and_topk_defaults(url):
    status, body = await _post(url, {"queries": [DEMO.questions[0].question]})
    assert status == 200
    [row] = body["result"]
    assert len(row) == 2  # the server's default topk
    assert all(set(doc) == {"id", "contents"} for doc in row)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"topk": 3}, "queries"),
        ({"queries": "one string"}, "queries"),
        ({"queries": ["a", 3]}, "queries"),
        ({"queries": ["a"], "topk": -1}, "topk"),
        ({"queries": ["a"], "topk": "3"}, "topk"),
        ({"queries": ["a"], "return_scores": "yes"}, "return_scores"),
        (["not", "an", "object"], "object"),
    ],
)
async def test_bad_requests_get_400_with_a_message(url, body, message):
    status, reply = await _post(url, body)
    assert status == 400 and message in reply["error"]


async def test_bad_json_gets_400(url):
    status, reply = await _post(url, raw=b"{not json")
    assert status == 400 and "not valid JSON" in reply["error"]


async def test_remote_retriever_reads_what_the_server_sends(url):
    remote = RemoteRetriever(url.removesuffix("/retrieve"))  # the base URL works too
    try:
        hits = await remote.retrieve([q.question for q in DEMO.questions[:3]], 3)
    finally:
        await remote.aclose()
    assert hits == RETRIEVER.search([q.question for q in DEMO.questions[:3]], 3)


async def test_env_searches_through_a_remote_server(url):
    env = SearchEnvironment({"retriever_url": url, "topk": 1})
    episode = await env.start(Task(prompt=DEMO.questions[0].question, label={"target": DEMO.questions[0].answers}))
    obs = await episode.step("<search>" + DEMO.questions[0].question + "</search>")
    await env.aclose()
    assert isinstance(obs, Observation)
    assert obs.messages[0]["content"].count("Doc ") == 1 and DEMO.questions[0].answers[0] in obs.messages[0]["content"]


async def test_a_dead_server_aborts_the_episode_instead_of_scoring_it():
    async with serving(make_app(RETRIEVER)) as base:
        pass  # the port is free again once the block exits
    env = SearchEnvironment({"retriever_url": base, "retriever_timeout_s": 2})
    episode = await env.start(Task(prompt="q", label={"target": ["x"]}))
    with pytest.raises(EpisodeAborted, match="retriever"):
        await episode.step("<search>anything</search>")
    await env.aclose()


async def test_server_error_reply_is_a_retriever_error():
    async with serving(make_app(RETRIEVER)) as base:
        remote = RemoteRetriever(base + "/missing")
        with pytest.raises(RetrieverError, match="404"):
            await remote.retrieve(["q"], 1)
        await remote.aclose()


def test_an_env_client_lives_on_one_event_loop():
    """A second loop is a clear error, not a session silently replaced (aiohttp binds a session to its loop)."""
    # nothing listens: each call fails after making its session (at once: the retries have their own tests)
    remote = RemoteRetriever("http://127.0.0.1:9", retries=0)

    async def call() -> None:
        with pytest.raises(RetrieverError):
            await remote.retrieve(["q"], 1)

    async def first_loop() -> None:
        await call()
        await call()  # the same loop reuses the session
        await remote.aclose()  # closed on the loop that made it

    asyncio.run(first_loop())
    asyncio.run(call())  # after aclose a new loop may start afresh

    with pytest.raises(RuntimeError, match="one loop"):
        asyncio.run(call())  # the session of the previous loop is still open: refused, named
    asyncio.run(remote.aclose())
