"""Eval suites: every YAML in recipes/eval parses; defaults merge; bad suites fail with the key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from aclarena_slime.evaluation import SuiteError, load_suite, parse_suite
from aclarena_slime.recipes.compiler import load_stage_suite

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "eval"


@pytest.mark.parametrize("path", sorted(RECIPES.rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_suite_parses(path):
    suite = load_stage_suite(path)
    assert suite.datasets
    for d in suite.datasets:
        assert d.env in {"math", "search", "retail", "ifeval"} and d.n_samples >= 1 and d.max_response_len > 0


def test_shipped_suites_exist():
    assert (RECIPES / "paper.yaml").exists()


def test_paper_suite_carries_the_authors_settings():
    suite = {d.name: d for d in load_stage_suite(RECIPES / "paper.yaml").datasets}
    assert (suite["aime26"].n_samples, suite["aime26"].max_response_len, suite["aime26"].domain) == (16, 16384, "math")
    assert (suite["nq"].limit, suite["nq"].domain) == (500, "search")
    assert (suite["retail"].temperature, suite["retail"].max_response_len) == (0.7, 2048)
    assert suite["ifeval"].top_p == 0.7 and suite["ifeval"].temperature == 1.0  # from defaults


def test_defaults_merge_and_dataset_wins():
    suite = parse_suite(
        {
            "defaults": {"temperature": 0.6, "n_samples": 4},
            "datasets": {"a": {"env": "math", "path": "a.jsonl", "n_samples": 2}, "b": {"env": "mock", "path": "b"}},
        },
        "s.yaml",
    )
    a, b = suite.datasets
    assert (a.temperature, a.n_samples, a.domain) == (0.6, 2, "math")
    assert (b.n_samples, b.sampling_params()["temperature"], b.sampling_params()["top_p"]) == (4, 0.6, 1.0)
    assert suite.name == "s"


def test_list_form_is_accepted():
    suite = parse_suite({"datasets": [{"name": "x", "env": "math", "path": "x.jsonl", "top_k": -1}]})
    assert suite.datasets[0].name == "x" and suite.datasets[0].sampling_params()["top_k"] == -1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"datasets": {"a": {"env": "math", "path": "p", "temprature": 1}}}, "unknown key(s) ['temprature']"),
        ({"datasets": {"a": {"path": "p"}}}, "'env' is required"),
        ({"datasets": {"a": {"env": "math", "path": "p", "n_samples": 0}}}, "n_samples must be a positive number"),
        ({"datasets": {"a": {"env": "math", "path": "p", "n_samples": 1.5}}}, "n_samples"),
        ({"datasets": {"a": {"env": "math", "path": "p", "env_config": [1]}}}, "env_config must be a mapping"),
        ({"datasets": {}}, "at least one dataset"),
        ({"dataset": {}}, "unknown top-level key"),
        ({"defaults": {"bogus": 1}, "datasets": {"a": {"env": "m", "path": "p"}}}, "defaults: unknown key"),
    ],
)
def test_malformed_suites_name_the_problem(data, message):
    with pytest.raises(SuiteError, match=None) as info:
        parse_suite(data, "bad.yaml")
    assert message in str(info.value) and "bad.yaml" in str(info.value)


def test_unreadable_suite_is_a_suite_error(tmp_path):
    (tmp_path / "s.yaml").write_text("datasets: [unclosed")
    with pytest.raises(SuiteError, match="cannot read eval suite"):
        load_suite(tmp_path / "s.yaml")


def test_select_limit_and_services():
    data = {
        "services": {"url": None, "root": "/data"},
        "datasets": {
            "a": {"env": "math", "path": "${services.root}/a.jsonl", "limit": 5},
            "b": {"env": "search", "path": "b", "env_config": {"url": "${services.url}", "k": 3}},
        },
    }
    suite = parse_suite(data, services={"url": "http://x:1"}).require_services()
    assert suite.datasets[0].path == "/data/a.jsonl"
    assert suite.datasets[1].env_config == {"url": "http://x:1", "k": 3}
    assert [d.limit for d in suite.with_limit(2).datasets] == [2, 2]
    assert [d.limit for d in suite.with_limit(9).datasets] == [5, 9]
    assert [d.name for d in suite.select(["b"]).datasets] == ["b"]
    with pytest.raises(SuiteError, match="no dataset c"):
        suite.select(["c"])
    unset = parse_suite(data)
    unset.select(["a"]).require_services()  # a dataset that needs no unset service runs
    with pytest.raises(SuiteError, match="b: url.*--service url=VALUE"):
        unset.require_services()
    with pytest.raises(SuiteError, match="no service \\['typo'\\] declared"):
        parse_suite(data, services={"typo": "x"})
    with pytest.raises(SuiteError, match="not declared under services"):
        parse_suite({"datasets": {"a": {"env": "math", "path": "${services.nope}/a"}}})


def test_demo_datasets_need_no_files():
    suite = parse_suite({"datasets": {"m": {"env": "math", "demo": 3}}})
    assert suite.datasets[0].demo == 3 and suite.datasets[0].path == ""
    with pytest.raises(SuiteError, match="either 'path'.*or 'demo'"):
        parse_suite({"datasets": {"m": {"env": "math", "demo": 3, "path": "x.jsonl"}}})
