"""Parsing model turns and scoring answers: the Search-R1 text protocol and its rewards."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aclarena_envs.search.protocol import INSTRUCTION, Action, format_information, make_prompt, parse_action
from aclarena_envs.search.reward import exact_match, f1, gold_answers, normalize_answer, trajectory_reward


@pytest.mark.parametrize(
    ("text", "kind", "content", "closed"),
    [
        ("<think>need facts</think>\n<search> capital of France </search>", "search", "capital of France", True),
        ("<answer> Paris </answer>", "answer", "Paris", True),
        ("<think>x</think><search>trimmed stop string", "search", "trimmed stop string", False),
        ("<think>I could <answer>Rome</answer></think><search>real query</search>", "search", "real query", True),
        ("<search>first</search> then <answer>second</answer>", "search", "first", True),
        ("no tags at all", None, "", False),
        ("<search></search>", "search", "", True),
        ("<think>never closed <search>q", "search", "q", False),
    ],
)
def test_parse_action(text, kind, content, closed):
    action = parse_action(text)
    assert (action.kind, action.content, action.closed) == (kind, content, closed)


def test_prompt_and_information_layout():
    prompt = make_prompt("  who wrote hamlet ")
    assert prompt == INSTRUCTION.replace("{question}", "who wrote hamlet?")
    assert prompt.endswith("Question: who wrote hamlet?\n")
    assert make_prompt("as is", "") == "as is"
    info = format_information([{"id": "1", "contents": '"Hamlet"\nA play by\nShakespeare.'}, {"contents": '"B"\nb'}])
    assert info == '<information>Doc 1(Title: "Hamlet") A play by\nShakespeare.\nDoc 2(Title: "B") b</information>'
    assert "No passage matched" in format_information([])


def test_normalisation_and_exact_match():
    assert normalize_answer("  The  Eiffel-Tower!! ") == "eiffeltower"
    assert normalize_answer("An apple a day") == "apple day"
    assert exact_match("the Paris.", ["London", "paris"]) == 1.0
    assert exact_match("Paris, France", ["Paris"]) == 0.0


def test_f1_is_the_best_token_overlap():
    assert f1("Paris France", ["Paris"]) == pytest.approx(2 / 3)
    assert f1("Paris", ["London", "Paris"]) == 1.0
    assert f1("", ["Paris"]) == 0.0


@pytest.mark.parametrize(
    ("correct", "well_formed", "format_score", "expected"),
    [
        (1.0, True, 0.2, 1.0),
        (1.0, False, 0.2, 0.8),
        (0.0, True, 0.2, 0.2),
        (0.0, False, 0.2, 0.0),
        (1.0, False, 0.0, 1.0),
    ],
)
def test_format_score_follows_search_r1(correct, well_formed, format_score, expected):
    assert trajectory_reward(correct, well_formed, format_score) == pytest.approx(expected)


def test_gold_answer_shapes():
    assert gold_answers({"target": ["Paris", "paris, france"]}) == ["Paris", "paris, france"]
    assert gold_answers({"golden_answers": "x"}) == ["x"]
    assert gold_answers([1889]) == ["1889"]
    for bad in (None, {}, {"target": []}, {"target": [{"a": 1}]}):
        with pytest.raises(ValueError, match="target"):
            gold_answers(bad)


def _regex_parse_action(text):
    """The former regular-expression parser, the reference for what the linear one must return."""
    visible = re.sub(r"<think>.*?</think>", " ", text, flags=re.DOTALL)
    pair = re.search(r"<(search|answer)>(.*?)</\1>", visible, re.DOTALL)
    if pair:
        return Action(pair.group(1), pair.group(2).strip(), closed=True)
    opens = list(re.finditer(r"<(search|answer)>", visible))
    if not opens:
        return Action(None)
    return Action(opens[-1].group(1), visible[opens[-1].end() :].strip(), closed=False)


_PIECES = ["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "q", " ", "\n", "<", ">"]


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=30))
def test_parse_action_agrees_with_the_regular_expressions(pieces):
    text = "".join(pieces)
    assert parse_action(text) == _regex_parse_action(text)


def test_parse_action_is_linear_on_repeated_tags():
    """``"<search>" * 10000`` took 6.5 s (four times that per doubling); 50,000 tags would take minutes.

    Run in a child process with a hard limit far above the linear parser's milliseconds, so the old
    quadratic parser fails here instead of stalling the suite.
    """
    code = (
        "from aclarena_envs.search.protocol import parse_action\n"
        "for tag in ('<search>', '<answer>', '<think>', '<think></search>'):\n"
        "    action = parse_action(tag * 50_000)\n"
        "print(parse_action('<search>' * 50_000).kind)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "search"
