"""The math env: answer extraction, the exact fast path, math-verify under a hard timeout, data."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from aclarena_envs.math.answer import final_answer, last_box_only, last_boxed
from aclarena_envs.math.data import main as prepare
from aclarena_envs.math.env import MathEnvironment
from aclarena_envs.math.verifier import VerifierPool, verify_answer
from aclarena_slime.cli import main as aclarena
from aclarena_slime.plugin.contract import Task


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("so the answer is \\boxed{073}", "073"),
        ("\\boxed{1} then \\boxed{\\frac{a}{b}}", "\\frac{a}{b}"),
        ("<think>maybe \\boxed{3}</think> final: \\boxed{4}", "4"),
        ("<think>maybe \\boxed{3}</think> no box after thinking", None),
        ("<think>cut off by the length limit \\boxed{3}", None),
        ("\\boxed{unbalanced", None),
        ("\\fbox{12}", "12"),
        ("no box at all", None),
    ],
)
def test_final_answer(response, expected):
    assert final_answer(response) == expected


def test_nested_braces():
    assert last_boxed("\\boxed{\\sqrt{2}+{1}}") == "\\sqrt{2}+{1}"
    assert last_boxed("} \\boxed {\\frac{1}{2}} {") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} {\\boxed{2}") == "2" and last_boxed("\\boxed{1} \\boxed{2") == "1"


@pytest.mark.parametrize(
    ("response", "ours", "authors"),
    [
        # an unclosed <think>: no answer for us, the whole response for the authors
        ("<think>cut off by the length limit \\boxed{3}", None, "3"),
        ("<think>a</think><think>b</think> \\boxed{5}", "5", "5"),
        # the very last \boxed decides for the authors, even when it does not close
        ("\\boxed{1} and then \\boxed{2", "1", None),
        ("\\fbox{12}", "12", None),
        ("\\boxed {7}", "7", None),
    ],
)
def test_the_authors_answer_rule(response, ours, authors):
    assert final_answer(response) == ours
    assert final_answer(response, "last", "whole_response") == authors


def test_only_the_window_is_searched():
    response = "\\boxed{42}" + " " * 1000
    assert final_answer(response, window=2000) == "42" and final_answer(response, window=500) is None
    assert last_box_only(response, window=500) is None and last_box_only(response, window=2000) == "42"


@pytest.fixture(scope="module")
def pool():
    p = VerifierPool(workers=1, timeout_s=3.0)
    yield p
    p.close()


async def test_exact_fast_path_needs_no_worker():
    never_started = VerifierPool(workers=1)
    for gold, pred, correct, method in [
        ("73", "073", True, "integer"),
        ("\\frac{1}{2}", "0.5", True, "exact"),
        ("(1,2)", "(1,3)", False, "exact"),
    ]:
        verdict = await verify_answer(gold, pred, never_started)
        assert verdict.correct is correct and verdict.method == method
    assert not never_started._started


async def test_math_verify_equivalence(pool):
    first = await verify_answer("\\frac{1}{3}", "0.3333333", pool)  # 7 places: math-verify's own rounding rules
    assert first.method == "math_verify" and first.correct
    assert await verify_answer("\\frac{1}{3}", "0.3333333", pool) is first, "math-verify's verdicts are cached"
    assert not (await verify_answer("x^2", "x^3", pool)).correct


async def test_pathological_answer_times_out_without_stalling_the_loop(pool):
    await verify_answer("2", "\\sqrt{4}", pool)  # the worker is warm: the timeout below is the check's own
    ticks = 0

    async def heartbeat():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    beat = asyncio.create_task(heartbeat())
    start = time.monotonic()
    verdict = await verify_answer("1", "9^{9^{9^{9}}}", pool)
    elapsed = time.monotonic() - start
    beat.cancel()
    assert not verdict.correct and verdict.method == "timeout"
    assert elapsed < pool.timeout_s + 2.0
    assert ticks >= elapsed / 0.05 * 0.5, "the event loop was blocked while verifying"
    # the pool still works afterwards (a killed worker is replaced)
    assert (await verify_answer("x^2", "x \\cdot x", pool)).correct


async def test_episode_scores_and_builds_the_prompt():
    env = MathEnvironment({"workers": 1})
    episode = await env.start(Task("What is 2+2?", "4", {"env": "math"}))
    assert episode.conversation.messages[0]["content"].endswith("\\boxed{}.")
    await episode.step("<think>2+2</think>\\boxed{4}")
    score = await episode.score()
    assert score.reward == 1.0 and score.breakdown["answer"] == "4"
    bare = MathEnvironment({"instruction": None})
    assert (await bare.start(Task("Q", "1"))).conversation.messages == [{"role": "user", "content": "Q"}]
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    assert (await env.start(Task(chat, "1"))).conversation.messages == chat


async def test_demo_records_are_scoreable():
    env = MathEnvironment({})
    records = env.demo_records(20, seed=1)
    assert records == env.demo_records(20, seed=1) and len({r["prompt"] for r in records}) > 10
    a, op, b = records[0]["prompt"].removeprefix("What is ").rstrip("?").split()
    assert int(records[0]["label"]) == eval(f"{a}{op}{b}")  # noqa: S307 - our own generated arithmetic


def test_demo_max_operand_widens_the_generated_problems_and_is_checked():
    """The default keeps the generator's problems as they were (operands 0-20); a wider range gives RL problems
    a warm start has not seen."""
    operands = lambda records: {int(x) for r in records for x in r["prompt"][8:-1].split()[::2]}  # noqa: E731
    default, wide = MathEnvironment({}).demo_records(2000, seed=3), MathEnvironment({"demo_max_operand": 50})
    assert max(operands(default)) == 20 and default[:5] == MathEnvironment({"demo_max_operand": 20}).demo_records(5, 3)
    assert max(operands(wide.demo_records(2000, seed=3))) == 50
    assert len({r["prompt"] for r in default}) <= 21 * 21 * 3 < len({r["prompt"] for r in wide.demo_records(2000, 3)})
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="demo_max_operand"):
            MathEnvironment({"demo_max_operand": bad})


def test_prepare_dapo_parquet_and_aime_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    dapo_prompt = (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nFind x if x+1=35.\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    table = pa.table(
        {
            "data_source": ["math_dapo"],
            "prompt": [[{"role": "user", "content": dapo_prompt}]],
            "reward_model": [{"ground_truth": "34", "style": "rule-lean"}],
        }
    )
    pq.write_table(table, tmp_path / "dapo.parquet")
    assert (
        prepare(
            ["--input", str(tmp_path / "dapo.parquet"), "--output", str(tmp_path / "train.jsonl"), "--split", "train"]
        )
        == 0
    )
    record = json.loads((tmp_path / "train.jsonl").read_text())
    assert record == {
        "prompt": "Find x if x+1=35.",
        "label": "34",
        "metadata": {"env": "math", "source": "math_dapo", "index": 0, "split": "train"},
    }

    (tmp_path / "aime.jsonl").write_text(json.dumps({"problem": "P1", "answer": 73}) + "\n")
    prepare(["--input", str(tmp_path / "aime.jsonl"), "--output", str(tmp_path / "aime26.jsonl"), "--source", "aime26"])
    assert json.loads((tmp_path / "aime26.jsonl").read_text())["label"] == "73"

    (tmp_path / "bad.jsonl").write_text('{"problem": "no answer"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: record has no answer"):
        prepare(["--input", str(tmp_path / "bad.jsonl"), "--output", str(tmp_path / "x.jsonl")])
    assert not (tmp_path / "x.jsonl").exists(), "a failed conversion leaves no half-written file"


def _cli(*args: str, stdin: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aclarena_slime", *args], input=stdin, capture_output=True, text=True, timeout=120
    )


def test_score_cli():
    out = _cli("score", "math", "--label", '"73"', stdin="so the answer is \\boxed{073}")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["reward"] == 1.0
    start = time.monotonic()
    out = _cli("score", "math", "--label", "1", "--config", '{"timeout_s": 3}', stdin="\\boxed{9^{9^{9^{9}}}}")
    assert out.returncode == 0 and json.loads(out.stdout)["reward"] == 0.0
    assert time.monotonic() - start < 60
    bad = _cli("score", "math", "--label", "{oops", stdin="x")
    assert bad.returncode == 2 and "--label is not valid JSON" in bad.stderr
    unknown = _cli("score", "nope", "--label", "1", stdin="x")
    assert unknown.returncode == 2 and "known tags" in unknown.stderr


def test_data_prepare_cli_dispatches_to_the_env(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({"problem": "P", "answer": "5"}) + "\n")
    out = _cli(
        "data",
        "prepare",
        "math",
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(tmp_path / "o.jsonl"),
        stdin="",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["written"] == 1


def test_data_prepare_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"problem": "P", "answer": "1"}) + "\n" + '{"problem": "Q"}\n')
    for source, expected in [("bad.jsonl", "bad.jsonl:2: record has no answer"), ("missing.jsonl", "No such file")]:
        argv = ["data", "prepare", "math", "--input", str(tmp_path / source), "--output", str(tmp_path / "o.jsonl")]
        assert aclarena(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("aclarena data: math: ") and expected in err and "Traceback" not in err


def test_last_boxed_is_linear_on_hostile_input():
    assert last_boxed("\\boxed{" * 200_000) is None
    assert last_boxed("\\boxed{" * 200_000 + "7}") == "7"


def test_misspelt_config_keys_are_refused():
    with pytest.raises(ValueError, match=r"unknown config keys of the math env \['timeout'\]; known: .*timeout_s"):
        MathEnvironment({"timeout": 3})


def test_the_shared_env_verifies_again_after_aclose():
    """The registry shares one env per process and ``aclarena score`` / the local stage call ``aclose`` on
    it: the verifier pool must start again on the next check, in a new event loop."""
    env = MathEnvironment({"workers": 1, "timeout_s": 3.0})

    async def score_then_close() -> float:
        episode = await env.start(Task("What is a half?", "0.5", {"env": "math"}))
        await episode.step("\\boxed{\\frac{1}{2}}")
        try:
            return (await episode.score()).reward
        finally:
            await env.aclose()

    assert asyncio.run(score_then_close()) == 1.0
    assert asyncio.run(score_then_close()) == 1.0


def test_the_paper_recipe_uses_the_authors_prompt_and_answer_rule(tmp_path):
    from pathlib import Path

    from aclarena_slime.recipes.compose import load_recipe

    recipes = Path(__file__).resolve().parents[3] / "recipes"
    recipe = load_recipe(recipes / "stage1_math.yaml", [f"paths.root={tmp_path}"])
    env = MathEnvironment(recipe.env_config["math"])
    assert (env.settings.prompt, env.settings.answer_rule, env.settings.unclosed_think) == (
        "dapo",
        "last",
        "whole_response",
    )
    prompt = env.conversation(Task("Find x if x+1=35.", "34")).messages[0]["content"]
    assert prompt.startswith("Solve the following math problem step by step.") and "\n\nFind x if x+1=35.\n\n" in prompt
    # the data preparation strips exactly this wording back off
    from aclarena_envs.math.data import problem_text

    assert problem_text({"prompt": prompt}) == "Find x if x+1=35."


def test_bad_rule_settings_are_refused():
    with pytest.raises(ValueError, match="answer_rule must be one of"):
        MathEnvironment({"answer_rule": "first"})


@pytest.mark.parametrize("label", [None, "", {"answer": None}, {"solution": "42"}])
def test_check_label_refuses_a_label_without_a_gold_answer(label):
    """A label with no gold answer fails where the data is read (check_label), not when its record is scored."""
    env = MathEnvironment({})
    with pytest.raises(ValueError, match="no gold answer"):
        env.check_label(label)
    for good in ("42", 42, {"answer": "\\frac{1}{2}"}, {"ground_truth": "7"}):
        env.check_label(good)
