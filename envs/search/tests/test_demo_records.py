"""Demo records are questions the env's own fallback corpus can answer."""

from __future__ import annotations

import pytest

from aclarena_envs.search.env import SearchEnvironment


async def test_demo_records_are_answerable_from_the_fallback_corpus():
    env = SearchEnvironment({})
    records = env.demo_records(12, seed=3)
    assert records == env.demo_records(12, seed=3) and records != env.demo_records(12, seed=4)
    assert all(r["metadata"]["env"] == "search" and r["label"]["target"] for r in records)
    retriever = await env.retriever()
    single = [r for r in records if r["metadata"]["hop"] == "single"]
    assert single
    for record in single:
        hits = (await retriever.retrieve([record["prompt"]], 3))[0]
        text = " ".join(h.document["contents"] for h in hits)
        assert any(answer in text for answer in record["label"]["target"]), record


def test_demo_records_refuse_a_configured_corpus(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"T\\"\\ntext"}\n')
    with pytest.raises(NotImplementedError, match="name a dataset"):
        SearchEnvironment({"corpus": str(corpus)}).demo_records(1)
