"""The final evaluation sends each env the requests its stage's training rollout sends (issue 43, §1).

One prompt of each env goes through the training rollout (slime's generate hook, with the sampling params
slime's rollout builds from the stage's compiled flags) and through ``aclarena eval run``'s runner on
recipes/eval/paper.yaml, against the same scripted engine; the request bodies must be equal turn by turn
except the sampling settings the suite lists (temperature and top-p: FIDELITY.md, "final evaluation").
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from aclarena_envs.search.demo_corpus import generate as demo_corpus
from aclarena_envs.search.retriever import BM25Retriever
from aclarena_envs.search.server import make_app
from aclarena_slime.evaluation import RunSettings, run_suite
from aclarena_slime.evaluation.suite import deep_merge
from aclarena_slime.http_service import serving
from aclarena_slime.recipes.compiler import compile_recipe, load_stage_suite, read_stage
from aclarena_slime.recipes.compose import load_recipe
from aclarena_slime.sglang_client import SGLangClient, new_session
from aclarena_slime.slime_edge.rollout import generate
from aclarena_slime.testing.fake_sglang import FakeSGLang
from aclarena_slime.testing.samples import FakeSample, make_args

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "recipes" / "eval" / "paper.yaml"
LISTED = {"temperature", "top_p"}  # what paper.yaml sets itself (FIDELITY.md rows "final evaluation")
DEMO = demo_corpus(40, seed=3)
QUESTION = DEMO.questions[0]


def _retail_conftest() -> Any:
    spec = importlib.util.spec_from_file_location("retail_fixtures", REPO / "envs" / "retail" / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flag(argv: list[str], name: str) -> list[str]:
    if name not in argv:
        return []
    out = []
    for arg in argv[argv.index(name) + 1 :]:
        if arg.startswith("--"):
            break
        out.append(arg)
    return out


def _training(stage: str, env: str, checkpoint: Path, engine: FakeSGLang, services: dict[str, Any]):
    """slime's args and rollout sampling params for ``stage`` (slime/rollout/sglang_rollout.py, GenerateState:
    temperature, top_p, top_k, max_new_tokens, stop, stop_token_ids, skip_special_tokens, no_stop_trim=True,
    spaces_between_special_tokens=False), the env's machine services replaced as the suite replaces them."""
    command = compile_recipe(load_recipe(REPO / "recipes" / f"{stage}.yaml"))
    argv, custom = command.train_args, command.custom_config
    length = int(_flag(argv, "--rollout-max-response-len")[0])
    context = _flag(argv, "--rollout-max-context-len")
    env_config = deep_merge(custom["aclarena_env_config"][env], services)
    args = make_args(
        checkpoint,
        engine.host,
        engine.port,
        rollout_max_response_len=length,
        rollout_max_context_len=int(context[0]) if context else None,
        eval_max_context_len=None,
        aclarena_response_budget=custom.get("aclarena_response_budget"),
        aclarena_env_config={env: env_config},
    )
    params = {
        "temperature": float((_flag(argv, "--rollout-temperature") or ["1.0"])[0]),
        "top_p": float((_flag(argv, "--rollout-top-p") or ["1.0"])[0]),
        "top_k": int((_flag(argv, "--rollout-top-k") or ["-1"])[0]),
        "max_new_tokens": length,
        "stop": _flag(argv, "--rollout-stop") or None,
        "stop_token_ids": [int(t) for t in _flag(argv, "--rollout-stop-token-ids")] or None,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    return args, params


def _without_listed(request: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(request))
    for key in LISTED:
        out["sampling_params"].pop(key, None)
    return out


async def _compare(tmp_path, tokenizer, checkpoint, name, record, replies, services, env_services, user=None):
    """Requests of the training rollout and of the eval for ``record``; asserts they agree turn by turn."""
    dataset = next(d for d in load_stage_suite(PAPER, services).datasets if d.name == name)
    bodies = {}
    for side in ("training", "eval"):
        user_engine = FakeSGLang(tokenizer, user) if user else None
        async with FakeSGLang(tokenizer, replies) as engine:
            extra: dict[str, Any] = {}
            if user_engine is not None:
                await user_engine.__aenter__()
                extra = {"user": {"base_url": f"{user_engine.url}/v1"}}
            try:
                if side == "training":
                    args, params = _training(dataset.stage, dataset.env, checkpoint, engine, {**env_services, **extra})
                    sample = FakeSample(prompt=record["prompt"], label=record.get("label"),
                                        metadata={**record.get("metadata", {}), "env": dataset.env})  # fmt: skip
                    await generate(args, sample, params)
                else:
                    data = tmp_path / "data"
                    target = dataset.resolved_path(data)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(json.dumps(record) + "\n")
                    suite = load_stage_suite(
                        PAPER, {**services, **({"user_sim_url": f"{user_engine.url}/v1"} if user_engine else {})}
                    ).select([name])
                    suite = replace(suite, datasets=tuple(replace(d, n_samples=1) for d in suite.datasets))  # one episode
                    session = new_session()
                    try:
                        client = SGLangClient(engine.url, session=session)
                        out = tmp_path / f"out-{name}"
                        await run_suite(suite, client, tokenizer, RunSettings(out_dir=out, data_root=data))
                    finally:
                        await session.close()
            finally:
                if user_engine is not None:
                    await user_engine.__aexit__(None, None, None)
            bodies[side] = list(engine.requests)
    training, evaluation = bodies["training"], bodies["eval"]
    assert len(training) == len(evaluation) > 0, (len(training), len(evaluation))
    for turn, (a, b) in enumerate(zip(training, evaluation, strict=True)):
        assert _without_listed(a) == _without_listed(b), f"{name}: turn {turn} differs"
    listed = {k: (training[0]["sampling_params"][k], evaluation[0]["sampling_params"][k]) for k in LISTED}
    return training, listed


async def test_math_eval_requests_equal_training(tmp_path, tiny_tokenizer, tiny_checkpoint):
    record = {"prompt": "What is 2 + 3?", "label": "5"}
    _, listed = await _compare(tmp_path, tiny_tokenizer, tiny_checkpoint, "aime26", record, ["\\boxed{5}"], {}, {})
    assert listed == {"temperature": (1.0, 1.0), "top_p": (1.0, 0.7)}  # multi_task.yaml:4


async def test_ifeval_eval_requests_equal_training_except_top_p(tmp_path, tiny_tokenizer, tiny_checkpoint):
    record = {
        "prompt": "Write one line without commas.",
        "label": {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
    }
    _, listed = await _compare(tmp_path, tiny_tokenizer, tiny_checkpoint, "ifeval", record, ["a line"], {}, {})
    assert listed == {"temperature": (1.0, 1.0), "top_p": (1.0, 0.7)}


async def test_search_eval_requests_equal_training_turn_by_turn(tmp_path, tiny_tokenizer, tiny_checkpoint):
    """Two turns: the second turn's max_new_tokens is the per-turn budget (4096) on both sides, not what is left
    of a total budget, and the context cap is the stage's."""
    call = f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{QUESTION.question}"}}}}\n</tool_call>'
    replies = [call, f"<answer> {QUESTION.answers[0]} </answer>"]
    record = {"prompt": QUESTION.question, "label": {"target": QUESTION.answers}}
    async with serving(make_app(BM25Retriever.from_documents(DEMO.passages), default_topk=3)) as base:
        url = f"{base}/retrieve"
        training, _ = await _compare(
            tmp_path, tiny_tokenizer, tiny_checkpoint, "nq", record, replies,
            {"retriever_url": url}, {"retriever_url": url},
        )  # fmt: skip
    assert [r["sampling_params"]["max_new_tokens"] for r in training] == [4096, 4096]


async def test_retail_eval_requests_equal_training_turn_by_turn(tmp_path, tiny_tokenizer, tiny_checkpoint):
    """The stage's stop id (151645) and per-turn budget reach every eval turn."""
    data_dir = _retail_conftest().write_data_dir(tmp_path / "tau3")
    lookup = '<tool_call>\n{"name": "find_user_id_by_email", "arguments": {"email": "ann@example.com"}}\n</tool_call>'
    replies = [lookup, "Which order would you like to cancel?", "Done."]
    customer = ["Hi, please cancel #W1.", "Order #W1, please.", "Thanks! ###STOP###"]
    record = {"prompt": "tau3-retail task t1", "label": "t1", "metadata": {"task_id": "t1", "split": "test"}}
    services = {"retail_data_dir": str(data_dir), "user_sim_model": "user_sim"}
    training, listed = await _compare(
        tmp_path, tiny_tokenizer, tiny_checkpoint, "retail", record, replies, services,
        {"data_dir": str(data_dir), "user": {"model": "user_sim"}}, user=customer,
    )  # fmt: skip
    assert all(r["sampling_params"]["stop_token_ids"] == [151645] for r in training)
    assert all(r["sampling_params"]["stop"] == ["</tool_call>"] for r in training)  # one call a turn
    assert {r["sampling_params"]["max_new_tokens"] for r in training} == {2048}
    assert listed == {"temperature": (1.0, 0.7), "top_p": (1.0, 1.0)}


@pytest.mark.parametrize("key", ["max_response_len", "max_turns", "top_k"])
def test_a_stage_bound_dataset_may_not_set_the_stages_own_settings(key):
    from aclarena_slime.evaluation import SuiteError, parse_suite

    data = {"datasets": {"a": {"env": "math", "path": "a.jsonl", "stage": "stage1_math", key: 5}}}
    with pytest.raises(SuiteError, match=f"{key}: set by stage 'stage1_math'"):
        parse_suite(data, "s.yaml", stages=read_stage)


def test_a_stage_bound_suite_without_a_stage_reader_is_refused():
    from aclarena_slime.evaluation import SuiteError, parse_suite

    data = {"datasets": {"a": {"env": "math", "path": "a.jsonl", "stage": "stage1_math"}}}
    with pytest.raises(SuiteError, match="reproduces stage 'stage1_math'; load the suite with a stage reader"):
        parse_suite(data, "s.yaml")
    with pytest.raises(SuiteError, match="stage 'no_such_stage': no stage recipe"):
        parse_suite({"datasets": {"a": {**data["datasets"]["a"], "stage": "no_such_stage"}}}, "s.yaml", stages=read_stage)
