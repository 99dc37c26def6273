"""The tag-free expert choice: accuracy on held-out prompts, persistence, and use by the gateway."""

from __future__ import annotations

import pytest

from aclarena_slime.router.classifier import TagClassifier, tokens
from aclarena_slime.router.tag_prompts import GENERATORS, TAGS, labelled_prompts
from aclarena_slime.testing.fake_sglang import FakeSGLang

from .conftest import client, gateway, post

TRAINING = labelled_prompts(120, seed=0)


@pytest.fixture(scope="module")
def classifier() -> TagClassifier:
    return TagClassifier.train([t for t, _ in TRAINING], [g for _, g in TRAINING], steps=120)


def test_prompts_cover_the_four_envs_and_held_out_excludes_training():
    train = labelled_prompts(20, seed=0)
    held_out = labelled_prompts(20, seed=1, exclude={text for text, _ in train})
    assert sorted({tag for _, tag in train}) == sorted(TAGS)
    assert all(sum(tag == t for _, tag in train) == 20 for t in TAGS)
    assert all(sum(tag == t for _, tag in held_out) == 20 for t in TAGS)
    assert not {text for text, _ in train} & {text for text, _ in held_out}


def test_exclude_fails_loudly_when_the_templates_run_dry(monkeypatch):
    monkeypatch.setitem(GENERATORS, "math", lambda r: "always the same")
    with pytest.raises(ValueError, match="cannot generate 2 'math' prompts"):
        labelled_prompts(2, use_demo_records=False, exclude={"always the same"})


def test_held_out_accuracy_per_env(classifier):
    held_out = labelled_prompts(60, seed=1, exclude={text for text, _ in TRAINING})
    assert not {text for text, _ in TRAINING} & {text for text, _ in held_out}
    for tag in TAGS:
        texts = [text for text, t in held_out if t == tag]
        assert classifier.accuracy(texts, [tag] * len(texts)) >= 0.9, tag


def test_free_text_prompts(classifier):
    assert classifier.predict("Find the remainder when 7^2024 is divided by 1000.")[0] == "math"
    assert classifier.predict("who was the director of the documentary on the Nile?")[0] == "search"
    assert classifier.predict("I want to return the backpack from my order, it is broken.")[0] == "retail"
    assert classifier.predict("Write a poem about friendship. Do not use any commas.")[0] == "ifeval"


def test_save_load_round_trip(classifier, tmp_path):
    path = tmp_path / "tags.json"
    classifier.save(path)
    loaded = TagClassifier.load(path)
    text = "Can you cancel order #W1234567?"
    assert loaded.predict(text) == pytest.approx(classifier.predict(text))
    path.write_text('{"kind": "something else"}')
    with pytest.raises(ValueError, match="cannot load tag classifier"):
        TagClassifier.load(path)


def test_tokens_fold_numbers_and_keep_symbols():
    assert tokens("x^2 = 49") == ["x", "^", "<num>", "=", "<num>", "x ^", "^ <num>", "<num> =", "= <num>"]


def test_training_input_is_checked():
    with pytest.raises(ValueError, match="as many tags as texts"):
        TagClassifier.train(["a"], [])


async def test_gateway_routes_untagged_requests_by_classifier(tiny_tokenizer, manifest, classifier):
    async with FakeSGLang(tiny_tokenizer, ["ok"]) as engine:
        async with gateway([engine.url], manifest, classifier=classifier) as (url, _), client() as http:
            chat = {
                "messages": [
                    {"role": "user", "content": "Write a blog post about remote work in all lowercase letters."}
                ]
            }
            status, _ = await post(http, f"{url}/v1/chat/completions", chat)
            assert status == 200
            status, _ = await post(
                http, f"{url}/generate", {"text": "Solve for x: 3x + 5 = 20.", "sampling_params": {}}
            )
            assert status == 200
            # token ids only: nothing to read, no default: a clear 400
            status, out = await post(http, f"{url}/generate", {"input_ids": [1, 2], "sampling_params": {}})
            assert status == 400 and "no environment tag" in out["error"]["message"]
    assert engine.requests[0]["model"] == "qwen3-8b-sdft:ifeval-expert"
    assert engine.requests[1]["lora_path"] == "math-expert"
