"""The eval runner against the fake SGLang engine: expert routing, per-sample lines, summary, resume."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from aclarena_slime.cli import main
from aclarena_slime.evaluation import ResultsExist, RunSettings, SuiteError, parse_suite, run_suite
from aclarena_slime.evaluation.suite import HELD_OUT_SEED
from aclarena_slime.experts import ExpertTable
from aclarena_slime.sglang_client import RetryPolicy, SGLangClient, SGLangError
from aclarena_slime.testing.fake_sglang import FakeSGLang

EXPERTS = {"math": "math-expert", "mock": "mock-expert"}


def _reply(payload):
    """Each expert knows its own domain; the base model knows nothing."""
    return {"math-expert": "<think>ok</think> \\boxed{73}", "mock-expert": "<guess>pear</guess>"}.get(
        payload.get("lora_path"), "no idea"
    )


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def data(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    _write(root / "math.jsonl", [{"prompt": "What is 70 + 3?", "label": "73"}, {"prompt": "2 + 3?", "label": "5"}])
    _write(root / "mock.jsonl", [{"prompt": "", "label": "pear", "metadata": {"env": "mock"}}])
    return root


def _suite():
    return parse_suite(
        {
            "name": "t",
            "datasets": {
                "arith": {"env": "math", "path": "math.jsonl", "n_samples": 2, "env_config": {"workers": 1}},
                "guess": {"env": "mock", "path": "mock.jsonl", "max_response_len": 64},
            },
        }
    )


def _lines(out: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (out / "samples" / f"{name}.jsonl").read_text().splitlines() if line]


async def test_each_domain_goes_to_its_expert_and_the_summary_is_right(tmp_path, data, tiny_tokenizer):
    out = tmp_path / "out"
    async with FakeSGLang(tiny_tokenizer, _reply) as engine:
        client = SGLangClient(engine.url)
        summary = await run_suite(
            _suite(), client, tiny_tokenizer, RunSettings(out, data, stage="s1"), ExpertTable.from_mapping(EXPERTS)
        )
    assert sorted(r["lora_path"] for r in engine.requests) == ["math-expert"] * 4 + ["mock-expert"]
    arith, guess = summary["datasets"]["arith"], summary["datasets"]["guess"]
    # 2 prompts x 2 samples: prompt 0 right twice, prompt 1 wrong twice -> 50%; pass@2 = 50%
    assert (arith["accuracy"], arith["pass_at_n"], arith["n_scored"], arith["n_unscored"]) == (50.0, 50.0, 4, 0)
    assert (guess["accuracy"], guess["lora_path"], guess["statuses"]) == (100.0, "mock-expert", {"completed": 1})
    assert summary["domains"] == {"math": 50.0, "mock": 100.0} and summary["stage"] == "s1"
    assert json.loads((out / "summary.json").read_text()) == summary
    lines = _lines(out, "arith")
    assert sorted((r["index"], r["sample"]) for r in lines) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    first = next(r for r in lines if r["index"] == 0)
    assert first["reward"] == 1.0 and first["turns"] == ["<think>ok</think> \\boxed{73}"]
    assert len(first["loss_mask"]) == len(first["response_ids"]) == first["response_tokens"] > 0
    assert first["prompt_ids"] == engine.requests[0]["input_ids"] or any(
        first["prompt_ids"] == r["input_ids"] for r in engine.requests
    )


async def test_without_experts_every_request_uses_the_base_model(tmp_path, data, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, _reply) as engine:
        summary = await run_suite(_suite(), SGLangClient(engine.url), tiny_tokenizer, RunSettings(tmp_path / "o", data))
    assert all("lora_path" not in r for r in engine.requests)
    assert summary["domains"] == {"math": 0.0, "mock": 0.0}


async def test_a_domain_without_expert_fails_early_or_uses_the_base(tmp_path, data, tiny_tokenizer):
    only_math = ExpertTable.from_mapping({"math": "math-expert"})
    async with FakeSGLang(tiny_tokenizer, _reply) as engine:
        client = SGLangClient(engine.url)
        with pytest.raises(SuiteError, match="no LoRA expert for environment tag 'mock'"):
            await run_suite(_suite(), client, tiny_tokenizer, RunSettings(tmp_path / "a", data), only_math)
        assert engine.requests == [] and not (tmp_path / "a").exists()
        settings = RunSettings(tmp_path / "b", data, base_for_missing_expert=True)
        summary = await run_suite(_suite(), client, tiny_tokenizer, settings, only_math)
    assert summary["datasets"]["guess"]["lora_path"] is None and summary["domains"]["math"] == 50.0


async def test_resume_redoes_only_what_is_missing_and_existing_results_are_kept(tmp_path, data, tiny_tokenizer):
    out = tmp_path / "out"
    experts = ExpertTable.from_mapping(EXPERTS)
    async with FakeSGLang(tiny_tokenizer, _reply) as engine:
        client = SGLangClient(engine.url)
        first = await run_suite(_suite(), client, tiny_tokenizer, RunSettings(out, data), experts)
        path = out / "samples" / "arith.jsonl"
        kept = path.read_text().splitlines()[:2]
        path.write_text("\n".join(kept) + "\n" + '{"dataset": "arith", "ind')  # a crash cut the third line
        with pytest.raises(ResultsExist):
            await run_suite(_suite(), client, tiny_tokenizer, RunSettings(out, data), experts)
        before = len(engine.requests)
        again = await run_suite(_suite(), client, tiny_tokenizer, RunSettings(out, data, resume=True), experts)
    assert len(engine.requests) - before == 2  # the two lost arith samples, nothing else
    assert again["datasets"] == first["datasets"]
    assert len(_lines_tolerant(path)) == 4


async def test_resume_with_a_smaller_limit_and_n_samples_counts_only_the_current_run(tmp_path, data, tiny_tokenizer):
    out = tmp_path / "out"
    experts = ExpertTable.from_mapping(EXPERTS)
    smaller = parse_suite(
        {"datasets": {"arith": {"env": "math", "path": "math.jsonl", "n_samples": 1, "env_config": {"workers": 1}}}}
    ).with_limit(1)
    async with FakeSGLang(tiny_tokenizer, _reply) as engine:
        client = SGLangClient(engine.url)
        await run_suite(_suite(), client, tiny_tokenizer, RunSettings(out, data), experts)  # 2 prompts x 2 samples
        before = len(engine.requests)
        again = await run_suite(smaller, client, tiny_tokenizer, RunSettings(out, data, resume=True), experts)
    assert len(engine.requests) == before  # (0, 0) is already scored
    arith = again["datasets"]["arith"]
    assert (arith["accuracy"], arith["pass_at_n"], arith["n_scored"], arith["n_unscored"]) == (100.0, 100.0, 1, 0)
    assert arith["statuses"] == {"completed": 1}


def _lines_tolerant(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


async def test_engine_rejection_is_a_failed_sample_not_a_crash(tmp_path, data, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, _reply) as engine:
        engine.adapters["something-else"] = "/x"  # the fake now rejects unknown adapters with 400
        summary = await run_suite(
            _suite(), SGLangClient(engine.url), tiny_tokenizer, RunSettings(tmp_path / "o", data),
            ExpertTable.from_mapping(EXPERTS),
        )  # fmt: skip
    arith = summary["datasets"]["arith"]
    assert (arith["accuracy"], arith["n_unscored"], arith["statuses"]) == (0.0, 4, {"failed": 4})
    line = _lines(tmp_path / "o", "arith")[0]
    assert line["end"] == "engine_error" and "has never been loaded" in line["error"] and line["reward"] is None


async def test_an_unreachable_endpoint_stops_the_run_with_an_error(tmp_path, data, tiny_tokenizer):
    async with FakeSGLang(tiny_tokenizer, _reply) as engine:
        url = engine.url
    client = SGLangClient(url, retry=RetryPolicy(attempts=1))
    with pytest.raises(SGLangError, match="no answer"):
        await run_suite(_suite(), client, tiny_tokenizer, RunSettings(tmp_path / "o", data))
    assert not (tmp_path / "o" / "summary.json").exists()


def test_cli_run_prints_a_table_and_writes_the_summary(tmp_path, data, tiny_checkpoint, tiny_tokenizer, capsys):
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "datasets:\n  guess: {env: mock, path: mock.jsonl, max_response_len: 64}\n"
        "  arith: {env: math, path: math.jsonl, env_config: {workers: 1}}\n"
    )
    with _engine_in_thread(tiny_tokenizer) as engine:
        argv = ["eval", "run", str(suite), "--endpoint", engine.url, "--tokenizer", str(tiny_checkpoint)]
        argv += ["--out", str(tmp_path / "out"), "--data-root", str(data), "--expert", "mock=mock-expert"]
        argv += ["--base-for-missing-expert", "--only", "guess", "arith", "--limit", "1"]
        assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "guess" in printed and "100.00" in printed and "mock-" in printed
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["datasets"]["arith"]["n_prompts"] == 1 and summary["domains"]["mock"] == 100.0


def test_cli_run_reports_a_bad_suite_as_a_user_error(tmp_path, tiny_checkpoint, capsys):
    suite = tmp_path / "suite.yaml"
    suite.write_text("datasets:\n  x: {env: mock}\n")
    argv = ["eval", "run", str(suite), "--endpoint", "http://127.0.0.1:9", "--tokenizer", str(tiny_checkpoint)]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert "give either 'path'" in capsys.readouterr().err


class _engine_in_thread:
    """The fake engine on its own event loop, so the CLI can run its own ``asyncio.run``."""

    def __init__(self, tokenizer):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.engine = FakeSGLang(tokenizer, _reply)

    def __enter__(self) -> FakeSGLang:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self.engine.__aenter__(), self.loop).result(10)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.engine.__aexit__(None, None, None), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def test_demo_dataset_runs_the_envs_generated_records(tmp_path, tiny_tokenizer):
    from aclarena_slime.plugin.registry import get_environment

    suite = parse_suite({"datasets": {"arith": {"env": "math", "demo": 3, "env_config": {"workers": 1}}}})
    expected = get_environment("math", {"workers": 1}).demo_records(3, seed=HELD_OUT_SEED)
    async with FakeSGLang(tiny_tokenizer, ["\\boxed{0}"]) as engine:
        summary = await run_suite(suite, SGLangClient(engine.url), tiny_tokenizer, RunSettings(tmp_path / "o"))
    lines = _lines(tmp_path / "o", "arith")
    assert [line["label"] for line in lines] == [r["label"] for r in expected]
    assert summary["datasets"]["arith"]["n_prompts"] == 3


async def test_a_bad_label_is_refused_when_the_dataset_is_read_naming_its_line(tmp_path, data, tiny_tokenizer,
                                                                              monkeypatch):  # fmt: skip
    """Not when its record is drawn: the env's check_label runs on every record as the data is loaded."""
    from aclarena_slime.evaluation.records import DatasetError
    from aclarena_slime.plugin.registry import load_factory

    def check_label(self, label):
        if label == 5:  # "5", decoded as Task.label_value decodes it
            raise ValueError("not a number this env can score")

    monkeypatch.setattr(load_factory("math"), "check_label", check_label)
    async with FakeSGLang(tiny_tokenizer, _reply) as engine:
        with pytest.raises(DatasetError, match=r"math.jsonl:2: bad label for env 'math': not a number"):
            await run_suite(_suite(), SGLangClient(engine.url), tiny_tokenizer, RunSettings(tmp_path / "o", data))
        assert engine.requests == []  # refused before any episode
