"""The tag-free expert choice: accuracy on held-out prompts, persistence, and use by the gateway."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import ClassVar

import pytest

from aclarena_slime.cli import main as cli_main
from aclarena_slime.plugin import registry
from aclarena_slime.plugin.contract import Environment
from aclarena_slime.router.classifier import TagClassifier, tokens
from aclarena_slime.router.tag_prompts import labelled_prompts
from aclarena_slime.testing.fake_sglang import FakeSGLang

from .conftest import TAGS, client, gateway, post, write_manifest

TRAINING = labelled_prompts(TAGS, 120, seed=0)


@pytest.fixture(scope="module")
def classifier() -> TagClassifier:
    return TagClassifier.train([t for t, _ in TRAINING], [g for _, g in TRAINING], steps=120)


def test_prompts_cover_the_four_envs_and_held_out_excludes_training():
    train = labelled_prompts(TAGS, 20, seed=0)
    held_out = labelled_prompts(TAGS, 20, seed=1, exclude={text for text, _ in train})
    assert sorted({tag for _, tag in train}) == sorted(TAGS)
    assert all(sum(tag == t for _, tag in train) == 20 for t in TAGS)
    assert all(sum(tag == t for _, tag in held_out) == 20 for t in TAGS)
    assert not {text for text, _ in train} & {text for text, _ in held_out}


class _Repetitive(Environment):
    tag: ClassVar[str] = "repetitive"

    async def start(self, task):
        raise NotImplementedError

    @classmethod
    def routing_prompts(cls, n: int, seed: int = 0) -> list[str]:
        return ["always the same"] * n


class _Silent(Environment):
    tag: ClassVar[str] = "silent"

    async def start(self, task):
        raise NotImplementedError


def test_exclude_fails_loudly_when_an_envs_prompts_run_dry(monkeypatch):
    monkeypatch.setitem(registry._registered, "repetitive", _Repetitive)
    assert labelled_prompts(["repetitive"], 2) == [("always the same", "repetitive")] * 2
    with pytest.raises(ValueError, match="'repetitive' gives only 0 routing prompts outside the 1 excluded"):
        labelled_prompts(["repetitive"], 2, exclude={"always the same"})


def test_an_env_without_routing_prompts_or_demo_records_says_so(monkeypatch):
    monkeypatch.setitem(registry._registered, "silent", _Silent)
    with pytest.raises(NotImplementedError, match="'silent' has no routing prompts.*override Environment.routing_prompts"):
        labelled_prompts(["silent"], 2)


def test_a_plugin_that_fails_to_load_is_an_error_not_skipped(monkeypatch):
    """It used to be swallowed (the classifier silently trained without the env's demo prompts)."""
    broken = EntryPoint(name="broken", value="aclarena_envs.no_such_env.env:Nope", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_entry_points", lambda: {"broken": broken})
    with pytest.raises(registry.PluginLoadError, match="'broken'.*no_such_env"):
        labelled_prompts(["broken"], 2)


def test_builtin_classifier_of_a_manifest_without_plugin_is_a_clear_cli_error(tmp_path, capsys):
    manifest = write_manifest(tmp_path, {"no-such-env": {"adapter": "x"}})
    argv = ["serve-router", "--engine", "http://127.0.0.1:1", "--experts", str(manifest), "--classifier", "builtin"]
    assert cli_main(argv) == 2
    assert "--classifier builtin: no environment registered under tag 'no-such-env'" in capsys.readouterr().err


def test_held_out_accuracy_per_env(classifier):
    held_out = labelled_prompts(TAGS, 60, seed=1, exclude={text for text, _ in TRAINING})
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


def test_variant_tags_of_one_plugin_give_the_prompts_of_their_own_settings():
    pytest.importorskip("reasoning_gym")
    configs = {"reasoning_gym-spell_backward": {"tasks": "spell_backward"}, "reasoning_gym-word_sorting": {"tasks": "word_sorting"}}
    pairs = labelled_prompts(sorted(configs), 6, seed=0, env_configs=configs)
    by_tag = {tag: {text for text, t in pairs if t == tag} for tag in configs}
    assert all(len(texts) == 6 for texts in by_tag.values())
    assert not by_tag["reasoning_gym-spell_backward"] & by_tag["reasoning_gym-word_sorting"]
    with pytest.raises(ValueError, match="'reasoning_gym-word_sorting' is a variant tag of the env 'reasoning_gym'"):
        labelled_prompts(["reasoning_gym-word_sorting"], 2)  # the plugin's class alone: every variant alike
