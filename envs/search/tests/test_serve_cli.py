"""``aclarena serve-retriever`` as a separate process, queried the way Search-R1's client does."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from aclarena_envs.search.demo_corpus import generate, write_jsonl
from aclarena_envs.search.retriever import default_cache_dir

DEMO = generate(60, seed=4)


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    corpus = write_jsonl(DEMO.passages, tmp_path_factory.mktemp("corpus") / "corpus.jsonl")
    cmd = [sys.executable, "-m", "aclarena_slime", "serve-retriever", "--corpus", str(corpus), "--port", "0", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        yield corpus, json.loads(line)["url"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_search_r1_client_format_with_and_without_scores(served):
    corpus, url = served
    assert url.startswith("http://127.0.0.1:") and url.endswith("/retrieve")
    queries = [DEMO.questions[0].question, DEMO.questions[3].question]
    status, scored = _post(url, json.dumps({"queries": queries, "topk": 3, "return_scores": True}).encode())
    assert status == 200 and len(scored["result"]) == 2
    for row in scored["result"]:
        assert len(row) == 3 and all(set(item) == {"document", "score"} for item in row)
        assert [item["score"] for item in row] == sorted((item["score"] for item in row), reverse=True)
    assert DEMO.questions[0].answers[0] in scored["result"][0][0]["document"]["contents"]
    status, bare = _post(url, json.dumps({"queries": queries, "topk": 3, "return_scores": False}).encode())
    assert status == 200 and bare["result"] == [[item["document"] for item in row] for row in scored["result"]]
    assert default_cache_dir(corpus).is_dir(), "the server's index is cached beside the corpus"


def test_malformed_request_is_a_400(served):
    _, url = served
    status, reply = _post(url, b'{"queries": [1, 2]}')
    assert status == 400 and "queries" in reply["error"]


def test_missing_corpus_is_a_user_error(tmp_path):
    cmd = [sys.executable, "-m", "aclarena_slime", "serve-retriever", "--corpus", str(tmp_path / "nope.jsonl")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "search corpus not found" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(("option", "value"), [("--topk", "0"), ("--topk", "-3")])
def test_a_bad_option_is_refused_by_the_envs_own_settings_check(tmp_path, capsys, option, value):
    """The command hands its options to SearchConfig, whose check names the setting; it has none of its own."""
    from aclarena_slime.cli import main

    corpus = write_jsonl(DEMO.passages[:5], tmp_path / "corpus.jsonl")
    assert main(["serve-retriever", "--corpus", str(corpus), option, value]) == 2
    assert f"search env: topk must be a positive integer, got {value}" in capsys.readouterr().err
