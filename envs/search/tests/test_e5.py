"""E5 dense retrieval on a tiny BERT built in-process (no downloads): prefixes, pooling, index, server."""

from __future__ import annotations

import json

import aiohttp
import numpy as np
import pytest

from aclarena_envs.search.config import SearchConfig
from aclarena_envs.search.demo_corpus import generate, write_jsonl
from aclarena_envs.search.e5 import E5Encoder
from aclarena_envs.search.env import build_retriever
from aclarena_envs.search.server import make_app
from aclarena_slime.cli import main as cli_main
from aclarena_slime.http_service import serving

DEMO = generate(40, seed=3)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    """A random 2-layer BERT and a WordPiece tokenizer trained here on the demo passages."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials, show_progress=False)
    tok.train_from_iterator([p["contents"] for p in DEMO.passages] + ["query: passage:"], trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer = BertTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=300,
    )
    path = tmp_path_factory.mktemp("tiny-e5")
    BertModel(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _by_hand(path: str, text: str) -> np.ndarray:
    """One text alone (no padding): mean of every token's last hidden state, unit length."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    with torch.inference_mode():
        hidden = model(**tokenizer([text], return_tensors="pt")).last_hidden_state[0]
    mean = hidden.mean(dim=0).numpy()
    return mean / np.linalg.norm(mean)


def test_prefixes_and_mean_pooling_over_the_attention_mask(tiny_bert):
    encoder = E5Encoder(tiny_bert)
    short, long = "capital city", " ".join(p["contents"] for p in DEMO.passages[:3])
    queries = encoder([short, long], True)  # the short text is padded in this batch
    assert queries.shape == (2, 32) and queries.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(queries[0], _by_hand(tiny_bert, "query: capital city"), atol=1e-5)
    passages = encoder([short], False)
    np.testing.assert_allclose(passages[0], _by_hand(tiny_bert, "passage: capital city"), atol=1e-5)
    assert not np.allclose(queries[0], passages[0]), "queries and passages are prefixed differently"
    assert encoder([], True).shape == (0, 32)


def test_config_checks_e5():
    with pytest.raises(ValueError, match="e5_model needs a corpus"):
        SearchConfig.from_mapping({"e5_model": "/m"})
    with pytest.raises(ValueError, match="e5_model or encoder"):
        SearchConfig.from_mapping({"e5_model": "/m", "encoder": "a.b:c", "corpus": "/c"})


async def test_index_build_command_and_the_retrieve_server(tiny_bert, tmp_path, capsys):
    pytest.importorskip("faiss", reason="faiss-cpu is the optional 'dense' extra")
    corpus = write_jsonl(DEMO.passages, tmp_path / "corpus.jsonl")
    index = tmp_path / "e5_Flat.index"
    argv = ["data", "prepare", "search", "dense-index", "--corpus", str(corpus), "--e5-model", tiny_bert]
    assert cli_main([*argv, "--out", str(index), "--batch-size", "7"]) == 0
    assert json.loads(capsys.readouterr().out) == {"passages": 40, "index": str(index)}

    retriever = build_retriever(
        SearchConfig.from_mapping({"corpus": str(corpus), "e5_model": tiny_bert, "dense_index": str(index)})
    )
    assert retriever.index.ntotal == 40
    query = DEMO.questions[0].question
    encoder = E5Encoder(tiny_bert)
    expected = encoder([p["contents"] for p in DEMO.passages], False) @ encoder([query], True)[0]
    best = np.argsort(-expected)[:3]
    async with serving(make_app(retriever, default_topk=3)) as base:
        async with aiohttp.ClientSession() as session:
            body = {"queries": [query], "topk": 3, "return_scores": True}
            async with session.post(f"{base}/retrieve", json=body) as resp:
                assert resp.status == 200
                [row] = (await resp.json())["result"]
    assert [item["document"]["id"] for item in row] == [str(DEMO.passages[i]["id"]) for i in best]
    np.testing.assert_allclose([item["score"] for item in row], expected[best], atol=1e-4)
    await retriever.aclose()


def test_index_build_reports_a_bad_corpus(tiny_bert, tmp_path, capsys):
    pytest.importorskip("faiss", reason="faiss-cpu is the optional 'dense' extra")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "ok"}\nnot json\n')
    argv = ["data", "prepare", "search", "dense-index", "--corpus", str(bad), "--e5-model", tiny_bert]
    assert cli_main([*argv, "--out", str(tmp_path / "x.index")]) != 0
    assert "bad.jsonl:2" in capsys.readouterr().err and not (tmp_path / "x.index").exists()


def test_serve_retriever_command_serves_the_e5_index(tiny_bert, tmp_path):
    """The service recipe's command line: ``aclarena serve-retriever --e5-model ... --dense-index ...``."""
    import subprocess
    import sys
    import urllib.request

    pytest.importorskip("faiss", reason="faiss-cpu is the optional 'dense' extra")
    corpus = write_jsonl(DEMO.passages, tmp_path / "corpus.jsonl")
    index = tmp_path / "e5_Flat.index"
    assert cli_main(["data", "prepare", "search", "dense-index", "--corpus", str(corpus), "--e5-model", tiny_bert,
                     "--out", str(index)]) == 0  # fmt: skip
    cmd = [sys.executable, "-m", "aclarena_slime", "serve-retriever", "--corpus", str(corpus), "--e5-model", tiny_bert,
           "--dense-index", str(index), "--port", "0", "--json"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        url = json.loads(line)["url"]
        query = DEMO.questions[1].question
        body = json.dumps({"queries": [query], "topk": 2}).encode()
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            [row] = json.loads(resp.read())["result"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    encoder = E5Encoder(tiny_bert)
    expected = encoder([p["contents"] for p in DEMO.passages], False) @ encoder([query], True)[0]
    assert [doc["id"] for doc in row] == [str(DEMO.passages[i]["id"]) for i in np.argsort(-expected)[:2]]


def test_an_index_built_by_another_encoder_is_refused(tiny_bert, tmp_path):
    faiss = pytest.importorskip("faiss", reason="faiss-cpu is the optional 'dense' extra")
    corpus = write_jsonl(DEMO.passages, tmp_path / "corpus.jsonl")
    other = faiss.IndexFlatIP(16)  # 16-dimensional vectors; the tiny E5 makes 32
    other.add(np.zeros((40, 16), dtype=np.float32))
    faiss.write_index(other, str(tmp_path / "other.index"))
    config = {"corpus": str(corpus), "e5_model": tiny_bert, "dense_index": str(tmp_path / "other.index")}
    with pytest.raises(ValueError, match="16-dimensional.*32"):
        build_retriever(SearchConfig.from_mapping(config))
