"""Scoring stays near-linear on pathological responses, and the one-pass counters agree with the regexes.

Before: the postscript, bullet-list, placeholder and title checks ran the reference's regular
expressions, which backtrack quadratically on runs of newlines, tabs, ``[`` or ``<`` (10⁵ newlines did
not return within 30 s); the word tokenizer took ~15 s on 1 MB.
"""

from __future__ import annotations

import re
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from aclarena_envs.ifeval.checkers import build_checker
from aclarena_envs.ifeval.checkers.formats import _DASH_ITEM, _STAR_ITEM, count_bullets, count_placeholders

# The reference's patterns (google-research instruction_following_eval, instructions.py).
PLACEHOLDER = re.compile(r"\[.*?\]")
STAR_BULLET = re.compile(r"^\s*\*[^\*].*$", re.MULTILINE)
DASH_BULLET = re.compile(r"^\s*-.*$", re.MULTILINE)
TITLE = re.compile(r"<<[^\n]+>>")
POSTSCRIPTS = {
    "P.S.": re.compile(r"\s*p\.\s?s\..*$", re.MULTILINE),
    "P.P.S": re.compile(r"\s*p\.\s?p\.\s?s.*$", re.MULTILINE),
    "Note:": re.compile(r"\s*note:.*$", re.MULTILINE),
}

pieces = st.lists(
    st.sampled_from(
        ["\n", " ", "\t", "\u2028", "*", "-", "[", "]", "<<", ">>", "<", ">", "a", "p.", "s.", "P. ", "note:"]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=500, deadline=None, database=None)
@given(pieces)
def test_one_pass_counters_agree_with_the_reference_regexes(text):
    assert count_placeholders(text) == len(PLACEHOLDER.findall(text))
    assert count_bullets(text, _STAR_ITEM) == len(STAR_BULLET.findall(text))
    assert count_bullets(text, _DASH_ITEM) == len(DASH_BULLET.findall(text))
    reference_title = any(t.lstrip("<").rstrip(">").strip() for t in TITLE.findall(text))
    assert build_checker("detectable_format:title", {}).check(text) == reference_title
    for marker, pattern in POSTSCRIPTS.items():
        checker = build_checker("detectable_content:postscript", {"postscript_marker": marker})
        assert checker.check(text) == (pattern.search(text.lower()) is not None)


CHILD = """
from aclarena_envs.ifeval.reward import Label, judge
ids = [
    ("detectable_content:postscript", {"postscript_marker": "P.S."}),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}),
    ("detectable_format:title", {}),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}),
]
label = Label(tuple(i for i, _ in ids), tuple(k for _, k in ids))
for unit in ["\\n", "\\t", " ", "***", "[", "<<", "-\\n", "\\n*"]:
    verdicts = judge(label, unit * (10**5 // len(unit)) + "x")
print("ok")
"""


def test_minimal_pathological_responses_are_judged_in_bounded_time():
    """The issue's minimal inputs (10⁵ newlines, tabs, ``[``, ...), every regex-based check, in a child
    process under a hard limit of 120 s (a single one of them took longer before; now well under a second)."""
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


async def test_an_answer_over_the_cap_follows_nothing_and_scoring_is_bounded():
    from aclarena_envs.ifeval.env import IFEvalEnvironment
    from aclarena_slime.plugin.contract import Task

    env = IFEvalEnvironment({"max_response_chars": 1000})
    label = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    try:
        episode = await env.start(Task(prompt="Write without commas.", label=label))
        await episode.step("<think>" + "x," * 5000 + "</think>" + "fine " * 150)  # thinking is not counted
        assert (await episode.score()).reward == 1.0
        await episode.step("A. " * 1000)
        score = await episode.score()
        assert score.reward == 0.0 and score.breakdown["too_long"] == 3000
        assert score.breakdown["instructions"] == [{"id": "punctuation:no_comma", "strict": False, "loose": False}]
    finally:
        await env.aclose()
