"""Tag → expert resolution rules, without any server."""

from __future__ import annotations

import pytest

from aclarena_slime.experts import ExpertError, ExpertTable
from aclarena_slime.router.routing import ExpertResolver, RouteError, prompt_text

from .conftest import write_manifest


@pytest.fixture
def resolver(manifest) -> ExpertResolver:
    return ExpertResolver(ExpertTable.load(manifest))


@pytest.mark.parametrize("tag", ["math", "search", "retail", "ifeval"])
def test_openai_model_suffix_picks_the_expert(resolver, tag):
    route, upstream = resolver.for_openai({"model": f"qwen3-8b-sdft:{tag}"}, None)
    assert (route.adapter, route.tag, route.source) == (f"{tag}-expert", tag, "model")
    assert upstream == f"qwen3-8b-sdft:{tag}-expert"


def test_header_and_base_and_shorthand(resolver):
    route, upstream = resolver.for_openai({"model": "qwen3-8b-sdft"}, "retail")
    assert route.adapter == "retail-expert" and upstream == "qwen3-8b-sdft:retail-expert"
    route, upstream = resolver.for_openai({"model": "qwen3-8b-sdft"}, None)
    assert route.adapter is None and route.source == "base" and upstream == "qwen3-8b-sdft"
    route, upstream = resolver.for_openai({"model": "search"}, None)
    assert route.adapter == "search-expert" and upstream == "qwen3-8b-sdft:search-expert"


def test_unknown_or_missing_tag_lists_known_tags(resolver):
    with pytest.raises(RouteError, match="known tags: ifeval, math, retail, search") as err:
        resolver.for_openai({"model": "qwen3-8b-sdft:chess"}, None)
    assert err.value.status == 400 and "'chess'" in str(err.value)
    with pytest.raises(RouteError, match="no environment tag.*X-Aclarena-Env"):
        resolver.for_generate({"input_ids": [1, 2]}, None)


def test_default_expert_serves_untagged_requests_only(tmp_path):
    table = ExpertTable.load(write_manifest(tmp_path, default="math"))
    resolver = ExpertResolver(table)
    route = resolver.for_generate({"input_ids": [1]}, None)
    assert (route.adapter, route.source) == ("math-expert", "default")
    with pytest.raises(RouteError, match="environment tag 'chess'; known tags"):  # a misspelt tag is never served
        resolver.for_openai({"model": "x:chess"}, None)


def test_generate_lora_path_must_be_a_known_adapter(resolver):
    assert resolver.for_generate({"lora_path": "ifeval-expert"}, None).adapter == "ifeval-expert"
    assert resolver.for_generate({"lora_path": None}, None).source == "base"
    batch = resolver.for_generate({"lora_path": ["math-expert", None, "retail-expert"]}, None)
    assert batch.needs == {"math-expert", "retail-expert"}
    for bad in ["../../etc/passwd", "/etc/passwd", ["math-expert", "../../etc/passwd"]]:
        with pytest.raises(RouteError, match="unknown adapter '../../etc/passwd'|unknown adapter '/etc/passwd'"):
            resolver.for_generate({"lora_path": bad}, None)


def test_manifest_paths_cannot_escape_the_experts_directory(tmp_path):
    for path in ["../../etc/passwd", "/etc/passwd", "experts/../../outside"]:
        manifest = write_manifest(tmp_path, experts={"math": {"adapter": "math", "path": path}})
        with pytest.raises(ExpertError, match="outside the experts' directory"):
            ExpertTable.load(manifest)
    with pytest.raises(ExpertError, match="invalid adapter name"):
        ExpertTable.load(write_manifest(tmp_path, experts={"math": {"adapter": "../math"}}))


def test_symlink_out_of_the_experts_directory_is_refused(tmp_path):
    (tmp_path / "experts").mkdir()
    (tmp_path / "experts" / "math").symlink_to("/etc")
    with pytest.raises(ExpertError, match="outside"):
        ExpertTable.load(write_manifest(tmp_path, experts={"math": {"adapter": "math", "path": "experts/math"}}))


def test_prompt_text_reads_messages_parts_tools_and_prompts():
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "return my order"}]},
        ],
        "tools": [{"type": "function", "function": {"name": "get_order_details"}}],
    }
    assert prompt_text(chat) == "be brief\nreturn my order\nget_order_details"
    assert prompt_text({"prompt": ["first", "second"]}) == "first"
    assert prompt_text({"prompt": 3}) == ""
