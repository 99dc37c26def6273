"""The hostile-output check of the conformance kit catches what it is for: escapes, bad rewards, hangs."""

from __future__ import annotations

import time

import pytest

from aclarena_slime.plugin import hostile
from aclarena_slime.plugin.conformance import ConformanceError, check_hostile_outputs
from aclarena_slime.plugin.contract import Conversation, Done, Environment, Episode, Observation, Score, Task


class Fragile(Episode):
    """Fails in the ways the corpus once found in this project's envs, one way per ``flaw``."""

    def __init__(self, flaw: str) -> None:
        self.flaw, self.text = flaw, ""
        self.conversation = Conversation([{"role": "user", "content": "go"}])

    async def step(self, text):
        self.text = text
        if self.flaw == "hang" and text.startswith("<search><search>"):
            time.sleep(3)  # a quadratic regex on the event loop, in miniature
        if self.flaw == "echo":
            return Observation([{"role": "tool", "content": text.replace("\\ud800", "\ud800")}])
        return Done()

    async def score(self):
        if self.flaw == "escape" and "\\boxed{9999" in self.text:
            int(self.text.split("{")[1].rstrip("}"))  # Python's integer-string limit raises ValueError
        reward = 2.0 if self.flaw == "range" and "<answer>" in self.text else 0.0
        return Score(reward)


class FragileEnv(Environment):
    tag = "fragile"

    async def start(self, task):
        return Fragile(task.label)


@pytest.mark.parametrize(
    ("flaw", "message"),
    [
        ("escape", "score() raised ValueError"),
        ("range", "outside reward_range"),
        ("echo", "not JSON-serialisable valid Unicode"),
        ("hang", "step() on turn '<search><search>"),
    ],
)
async def test_each_flaw_is_reported_with_its_input(flaw, message):
    with pytest.raises(ConformanceError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        await check_hostile_outputs(FragileEnv(), [Task("", flaw)], examples=5, size=1_000, call_deadline_s=1.0)


async def test_a_sound_env_passes():
    await check_hostile_outputs(FragileEnv(), [Task("", "none")], examples=5, size=1_000)


def test_the_corpus_holds_the_issues_minimal_inputs():
    turns = hostile.corpus(80_000)
    assert "<search>" * 10_000 in turns and "\n" * 80_000 in turns
    assert '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>' in turns
    assert all(t.encode("utf-8") for t in turns)  # model text is decoded text: valid Unicode
    drawn = hostile.random_turns(30, size=1_000)
    assert len({family for family, _ in drawn}) == len(hostile._families(1_000))
