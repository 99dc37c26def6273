"""The authors' search reward as their code computes it (``shaped_effective``) beside the documented table
(``shaped``): the cases where the two disagree, each with both verdicts, and where they agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from aclarena_envs.search.env import SearchEnvironment
from aclarena_envs.search.protocol import make_prompt
from aclarena_envs.search.retriever import Hit
from aclarena_envs.search.shaped_reward import authors_answer
from aclarena_envs.search.tool_protocol import TOOL_INSTRUCTION
from aclarena_slime.plugin.contract import Task
from aclarena_slime.recipes.compose import load_recipe

RECIPES = Path(__file__).resolve().parents[3] / "recipes"
QUESTION = "What is the capital of France?"
PASSAGE = {"id": "1", "contents": '"France"\nParis is the capital of France.'}


class EveryQueryHits:
    """A retriever that returns one passage for any query, the empty one included (as an E5 server does)."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Hit]]:
        self.queries += queries
        return [[Hit(PASSAGE, 1.0)] for _ in queries]

    async def aclose(self) -> None:
        return None


def call(query: str) -> str:
    return f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{query}"}}}}\n</tool_call>'


async def _score(reward: str, turns: list[str], gold: str = "Paris") -> float:
    env = SearchEnvironment({"protocol": "tool_call", "reward": reward, "max_turns": 5})
    env._retriever = EveryQueryHits()
    episode = await env.start(Task(QUESTION, {"target": [gold]}, {"env": "search"}))
    for turn in turns:
        await episode.step(turn)
    return (await episode.score()).reward


SEARCH = call("capital of France")
# (turns, gold, the documented table, the authors' code)
DIFFERENCES = [
    ([SEARCH] * 5, "Paris", -0.05, -0.2),  # turn limit without an answer: the prompt's "Beijing" is the answer
    ([SEARCH, "I am not sure."], "Paris", -0.05, -0.2),  # a turn with no action after a search
    ([SEARCH, "no action"], "Beijing", -0.05, 0.7),  # truncated, and the prompt's example answer is gold
    (["<think>I will write <answer> later</think>" + SEARCH, "<answer> Paris </answer>"], "Paris", 0.7, -0.2),
    ([call(""), "<answer> Paris </answer>"], "Paris", 0.5, 1.0),  # an empty query is searched by theirs
]
SAME = [
    ([SEARCH, "<answer> Paris </answer>"], 1.0),
    (["<answer> Paris </answer>"], 0.5),
    ([call("France"), "<answer> Lyon </answer>"], 0.4),  # the passage holds the gold answer
    (["<answer> Lyon </answer>"], -0.05),
    (["no action at all"], -0.2),
]


@pytest.mark.parametrize(("turns", "gold", "documented", "effective"), DIFFERENCES)
async def test_where_the_authors_code_departs_from_their_table(turns, gold, documented, effective):
    assert await _score("shaped", turns, gold) == documented
    assert await _score("shaped_effective", turns, gold) == effective


@pytest.mark.parametrize(("turns", "both"), SAME)
async def test_where_they_agree(turns, both):
    assert await _score("shaped", turns) == both
    assert await _score("shaped_effective", turns) == both


def test_the_authors_answer_extraction():
    prompt = make_prompt(QUESTION, TOOL_INSTRUCTION)
    assert authors_answer(prompt) == "Beijing"  # the instruction's own two pairs
    assert authors_answer("<answer> x </answer>") is None  # one pair alone is no answer
    assert authors_answer(prompt + "<answer> Paris </answer>") == "Paris"
    assert authors_answer(prompt + "<answer> a <answer> b </answer>") == "a <answer> b"
    assert authors_answer(prompt + "<answer>" * 10_000) == "Beijing"


def test_the_paper_recipes_use_the_effective_rule(tmp_path):
    for name in ("stage2_search.yaml", "oracle_search.yaml", "mle_search.yaml"):
        recipe = load_recipe(RECIPES / name, [f"paths.root={tmp_path}"])
        assert recipe.env_config["search"]["reward"] == "shaped_effective", name


def test_the_effective_rule_needs_the_tool_protocol():
    with pytest.raises(ValueError, match="set protocol: tool_call"):
        SearchEnvironment({"reward": "shaped_effective"})
