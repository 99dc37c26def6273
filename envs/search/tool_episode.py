"""A search episode in the authors' tool-call protocol (``protocol: tool_call``), see :mod:`.tool_protocol`.

The model's turns and the tool responses it saw are kept as one text, in the order the chat template
renders them, so the authors' format rule (:func:`.tool_protocol.well_formed`) reads what their
scorer read. Rewards: ``em`` / ``f1`` as in the tag protocol, ``shaped`` (the authors' documented table)
or ``shaped_effective`` (the table as their code computes it, :mod:`.shaped_reward`; an empty query is
then searched as theirs is, where otherwise it gets a notice and does not count).
"""

from __future__ import annotations

from typing import Any, Protocol

from aclarena_slime.plugin.contract import Conversation, Done, Episode, EpisodeAborted, Observation, Score, Task

from .config import SHAPED, SearchConfig
from .protocol import INSTRUCTION, make_prompt
from .retriever import Retriever, RetrieverError
from .reward import exact_match, f1, trajectory_reward
from .shaped_reward import (
    SHAPED_RANGE,
    ShapedInputs,
    authors_answer,
    effective_reward,
    retrieval_correct,
    shaped_reward,
)
from .tool_protocol import (
    RESPONSE_CLOSE,
    RESPONSE_OPEN,
    SEARCH_TOOL,
    TOOL_INSTRUCTION,
    TOOL_STOP_STRINGS,
    format_passages,
    parse_tool_action,
    well_formed,
)

NO_PASSAGE = "No passage matched the query. Try different words."


def protocol_settings(cfg: SearchConfig) -> tuple[tuple[str, ...], tuple[float, float] | None]:
    """The tool-call protocol's stop strings, and the reward range its reward needs (None: the env's default)."""
    return TOOL_STOP_STRINGS, (SHAPED_RANGE if cfg.reward in SHAPED else None)


def tool_instruction(cfg: SearchConfig) -> str:
    """The user prompt template: the authors' tool instruction unless the recipe names its own."""
    return TOOL_INSTRUCTION if cfg.instruction == INSTRUCTION else cfg.instruction


class SearchHost(Protocol):
    """What an episode reads from its env (``SearchEnvironment`` is one): the settings and the retriever."""

    cfg: SearchConfig

    async def retriever(self) -> Retriever: ...


class ToolSearchEpisode(Episode):
    """One question answered through ``search`` tool calls and a final ``<answer>``."""

    def __init__(self, env: SearchHost, task: Task, golds: list[str]) -> None:
        self.env, self.golds = env, golds
        if isinstance(task.prompt, list):
            messages = [dict(m) for m in task.prompt]
        else:
            messages = [{"role": "user", "content": make_prompt(str(task.prompt), tool_instruction(env.cfg))}]
        self.conversation = Conversation(messages, tools=[SEARCH_TOOL])
        self.prompt_text = "".join(str(m.get("content") or "") for m in messages)  # what their scorer also reads
        self.turns = 0
        self.searches = 0  # searches run against the retriever
        self.tool_calls = 0  # searches that returned passages (the authors' "executed tool call")
        self.answer: str | None = None
        self.trajectory: list[str] = []  # model turns and tool responses, as rendered
        self.responses: list[str] = []
        self.end = "turn_limit"

    async def step(self, text: str) -> Observation | Done:
        cfg = self.env.cfg
        self.turns += 1
        self.trajectory.append(text)
        action = parse_tool_action(text)
        if action.kind == "answer":
            self.answer, self.end = action.content, "answer"
            return Done("answer")
        if action.kind is None:  # the authors end the episode on a turn with no action (no_drift.py:865-874)
            self.end = "no_action"
            return Done("no_action")
        content = await self._search(action.content)
        self.responses.append(content)
        self.trajectory.append(f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}")
        if self.turns >= cfg.max_turns:  # the search ran (it counts), but no turn is left to read it
            self.end = "max_turns"
            return Done("max_turns")
        return Observation([{"role": "tool", "content": content}])

    async def _search(self, query: str) -> str:
        cfg = self.env.cfg
        if not query and cfg.reward != "shaped_effective":
            return "The search query was empty. Call search with a few keywords."
        if len(query) > cfg.max_query_chars:
            return f"The search query was {len(query)} characters long; the limit is {cfg.max_query_chars}."
        self.searches += 1
        try:
            [hits] = await (await self.env.retriever()).retrieve([query], cfg.topk)
        except RetrieverError as exc:
            raise EpisodeAborted(f"search retriever failed: {exc}") from exc
        if not hits:
            return NO_PASSAGE
        self.tool_calls += 1
        return format_passages([h.document for h in hits])

    async def score(self) -> Score:
        cfg = self.env.cfg
        answer = self.answer
        em = exact_match(answer, self.golds) if answer is not None else 0.0
        f1_value = f1(answer, self.golds) if answer is not None else 0.0
        formed = well_formed("".join(self.trajectory))
        executed = self.tool_calls > 0
        hit = executed and retrieval_correct(self.responses, self.golds)
        if cfg.reward == "shaped":
            reward = shaped_reward(ShapedInputs(answer, self.golds, formed, executed, self.responses))
        elif cfg.reward == "shaped_effective":
            effective = authors_answer(self.prompt_text + "".join(self.trajectory))
            inputs = ShapedInputs(effective, self.golds, formed, executed, self.responses)
            reward = effective_reward(inputs, truncated=self.end != "answer")
        else:
            reward = trajectory_reward(em if cfg.reward == "em" else f1_value, formed, cfg.format_score)
        breakdown: dict[str, Any] = {
            "answer": answer,
            "gold": self.golds,
            "em": em,
            "f1": f1_value,
            "well_formed": formed,
            "turns": self.turns,
            "searches": self.searches,
            "tool_calls": self.tool_calls,
            "retrieval_correct": hit,
            "end": self.end,
        }
        return Score(reward, breakdown)
