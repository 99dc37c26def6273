"""The τ³-Retail environment (stage 3): a customer-service agent with 16 tools and a simulated customer.

An episode starts with the agent's system prompt (an instruction plus the data directory's
``policy.md``) and the simulated customer's first message. Each model turn is either tool calls
(``<tool_call>{"name", "arguments"}</tool_call>``, answered by ``tool`` messages; a call that cannot be
read or is refused is answered by an ``Error: ...`` message and changes nothing) or a message to the
customer (answered by the customer's reply as a ``user`` message). The customer ends the episode with
``###STOP###``, ``###TRANSFER###`` or ``###OUT-OF-SCOPE###``; a failing simulator aborts it. A simulator
that fails at the greeting, before the agent has said anything, always aborts the episode: the sample is
removed (zero gradient, kept out of its group's baseline), as the authors' no-op sample
(``generate_with_tau.py:114-174; trainable_agents.py:497-515``).

``turn_parsing: authors`` reads each turn as the authors' agent does (:mod:`.authors_turns`): every turn stops at
the first ``</tool_call>``, a turn without a readable call to a known tool is said to the customer, whole, and
the episode goes on; ``strict`` (the default) answers an unreadable call with an error message, ignores calls
inside the thinking, and with ``shaping`` ends the episode on an unreadable or empty turn.

Reward range {0.0, 1.0}: the final database equals the one the gold actions produce (and, where the
task's basis asks, the required information was said). See :mod:`.reward`. With ``shaping`` set, the
ACLArena authors' values for malformed, truncated and aborted episodes apply (:mod:`.shaping`).

Config (recipe ``aclarena_env_config.retail``)::

    data_dir: /data/tau3/retail     # required: db.json, tasks.json, split_tasks.json, policy.md
    max_turns: 30                   # model turns per episode
    user:                           # the simulated customer
      kind: llm                     # or: scripted, with replies: [...]
      base_url: http://127.0.0.1:30001/v1
      model: Qwen3-32B
      temperature: 0.0
    tool_call_format: {open: "<tool_call>", close: "</tool_call>", think_end: "</think>"}
    shaping: null                   # or {} / {truncated: -0.2, ...}: the authors' shaped reward (shaping.py)
    max_turn_chars: 65536           # a longer model turn is not read: an error answer, nothing runs or is sent
    max_tool_calls: 16              # calls run per turn; the rest get one error answer
    first_call_only: false          # true: only a turn's first call runs, the rest are dropped unanswered
                                    # (the authors' agent, tau-bench/trainable_agents.py:117-131)
    turn_parsing: strict            # or authors: the authors' agent's reading of a turn (authors_turns.py)
    max_error_chars: 1000           # a refusal's text (which may echo the model's arguments) is cut here
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

from aclarena_envs.retail import routing
from aclarena_envs.retail.authors_turns import ABORT, CALL, parse_authors_turn
from aclarena_envs.retail.data import TAG, RetailData, records, task_id_of
from aclarena_envs.retail.db import canonical_hash
from aclarena_envs.retail.reward import GoldReplay, replay_gold, score_episode
from aclarena_envs.retail.shaping import RetailShaping, turn_well_formed
from aclarena_envs.retail.tool_calls import MalformedCall, ToolCall, ToolCallParser
from aclarena_envs.retail.tools import TOOL_SPECS, WRITE_TOOLS, RetailTools, tool_schemas
from aclarena_envs.retail.user_sim import (
    AGENT_GREETING,
    UserSession,
    UserSimulator,
    build_user_simulator,
    scenario_text,
    stop_reason,
)
from aclarena_slime.plugin.contract import (
    Conversation,
    Done,
    Environment,
    Episode,
    EpisodeAborted,
    Message,
    Observation,
    Score,
    Task,
)

AGENT_INSTRUCTION = """You are a customer service agent of an online retail store. Help the customer as the <policy> below allows.
Each turn, either write a message to the customer or call tools, never both.
Follow the policy, and make every tool call valid JSON."""

CONFIG_KEYS = {
    "data_dir",
    "max_turns",
    "user",
    "tool_call_format",
    "max_turn_chars",
    "max_tool_calls",
    "max_error_chars",
    "shaping",
    "first_call_only",
    "turn_parsing",
}
TURN_PARSING = ("strict", "authors")
# Caps on what one model turn can cost or make the env echo (hitting one is an answer, never an error).
CAPS = {"max_turn_chars": 65_536, "max_tool_calls": 16, "max_error_chars": 1_000}


def system_prompt(policy: str) -> str:
    return f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{policy}\n</policy>"


def _error(message: str) -> Message:
    return {"role": "tool", "content": f"Error: {message}"}


class RetailEpisode(Episode):
    """One customer conversation over its own copy of the database."""

    def __init__(self, env: RetailEnvironment, task: dict[str, Any], user: UserSession, first_message: str) -> None:
        self.env, self.task, self.user = env, task, user
        self.tools = RetailTools(env.data.db.fresh())
        self.agent_messages: list[str] = []
        self.wrote = False  # whether any write succeeded: an untouched database needs no hashing
        self.ended = stop_reason(first_message)
        self.aborted = False  # the agent wrote a turn that cannot be read (shaping only)
        self.bad_turns = 0  # turns that break the authors' format rule
        self.user_failed = False  # the simulator failed and shaping scores that (shaping.user_failure)
        self.conversation = Conversation(
            [{"role": "system", "content": system_prompt(env.data.policy)}, {"role": "user", "content": first_message}],
            tools=tool_schemas(),
        )

    async def step(self, text: str) -> Observation | Done:
        if self.ended:
            return Done(self.ended)
        caps = self.env.caps
        if len(text) > caps["max_turn_chars"]:
            limit = caps["max_turn_chars"]
            return Observation([_error(f"the turn has {len(text)} characters, over {limit}; nothing was run or sent.")])
        self.bad_turns += not turn_well_formed(text)
        if self.env.turn_parsing == "authors":
            return await self._authors_step(text)
        turn = self.env.parser.parse(text)
        if self.env.shaping is not None and _broken(turn):  # strict: ends here (the authors' agent goes on)
            self.aborted = True
            return Done("malformed_turn")
        if turn.content:
            self.agent_messages.append(turn.content)
        if turn.calls and self.env.first_call_only:
            return Observation([self._answer(turn.calls[0])])
        if turn.calls:
            answers = [self._answer(call) for call in turn.calls[: caps["max_tool_calls"]]]
            if len(turn.calls) > caps["max_tool_calls"]:
                skipped = len(turn.calls) - caps["max_tool_calls"]
                answers.append(
                    _error(f"at most {caps['max_tool_calls']} tool calls per turn; {skipped} more were not run.")
                )
            return Observation(answers)
        return await self._say(turn.content)

    async def _authors_step(self, text: str) -> Observation | Done:
        """A turn as the authors' agent reads it: one call, a message to the customer, or an abort."""
        turn = parse_authors_turn(text, TOOL_SPECS)
        if turn.action == ABORT:
            self.aborted = True
            return Done("malformed_turn")
        if turn.action == CALL:
            return Observation([self._answer(ToolCall(turn.name, turn.arguments))])
        self.agent_messages.append(turn.content)
        return await self._say(turn.content)

    async def _say(self, content: str) -> Observation | Done:
        """``content`` to the customer; their reply, or the end they call."""
        try:
            reply = await self.user.reply(content)
        except EpisodeAborted:
            if self.env.shaping is None or self.env.shaping.user_failure is None:
                raise  # the sample is dropped (an outside service failed)
            self.user_failed = True
            return Done("user_failure")
        self.ended = stop_reason(reply)
        if self.ended:
            return Done(self.ended)
        return Observation([{"role": "user", "content": reply}])

    def _answer(self, call: Any) -> Message:
        cut = self.env.caps["max_error_chars"]
        if isinstance(call, MalformedCall):
            return _error(call.error[:cut])
        result = self.tools.call(call.name, call.arguments)
        self.wrote = self.wrote or (call.name in WRITE_TOOLS and not result.error)
        return {"role": "tool", "name": call.name, "content": result.content[:cut] if result.error else result.content}

    def db_hash(self) -> str:
        return canonical_hash(self.tools.db) if self.wrote else self.env.data.db.hash

    async def score(self) -> Score:
        gold = self.env.gold(self.task)
        score = score_episode(self.task, self.db_hash(), gold.db_hash, self.agent_messages)
        score.breakdown["end"] = "malformed_turn" if self.aborted else self.ended or "turn_limit"
        if self.env.shaping is None:
            return score
        if self.user_failed and self.env.shaping.user_failure is not None:
            score.breakdown["end"] = "user_failure"
            return Score(self.env.shaping.user_failure, {**score.breakdown, "task_reward": score.reward})
        truncated = not self.ended  # neither the customer nor a broken turn ended it: turn limit or budget
        return self.env.shaping.shape(score, aborted=self.aborted, truncated=truncated, bad_turns=self.bad_turns)


def _broken(turn: Any) -> bool:
    """A turn strict shaping aborts on: a tool call it cannot read, or nothing at all."""
    return any(isinstance(call, MalformedCall) for call in turn.calls) or (not turn.calls and not turn.content)


class RetailEnvironment(Environment):
    tag: ClassVar[str] = TAG
    prepare_data: ClassVar[str] = "aclarena_envs.retail.data.main"

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        user_simulator: UserSimulator | None = None,
        data: RetailData | None = None,
    ) -> None:
        """``user_simulator`` and ``data`` replace what ``config`` would build (tests, the gold replay)."""
        super().__init__(config)
        unknown = set(self.config) - CONFIG_KEYS
        if unknown:
            raise ValueError(f"retail env: unknown settings {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
        self.caps = {key: self.config.get(key, default) for key, default in CAPS.items()}
        for key, value in self.caps.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"retail env: {key} must be a positive integer, got {value!r}")
        if data is None and not self.config.get("data_dir"):
            raise ValueError(
                "retail env needs data_dir: a τ³-Retail data directory (db.json, tasks.json, split_tasks.json, policy.md)"
            )
        self.data = data if data is not None else RetailData.load(self.config["data_dir"])
        self.max_turns = int(self.config.get("max_turns", 30))
        if self.max_turns < 1:
            raise ValueError("retail env: max_turns must be at least 1")
        self.parser = ToolCallParser.from_config(self.config.get("tool_call_format"))
        self.turn_parsing = self.config.get("turn_parsing", "strict")
        if self.turn_parsing not in TURN_PARSING:
            raise ValueError(f"retail env: turn_parsing must be one of {', '.join(TURN_PARSING)}, got {self.turn_parsing!r}")
        if self.turn_parsing == "authors":  # every turn ends at its first call (trainable_agents.py:479-481)
            self.stop = (self.parser.close_tag,)
        self.first_call_only = self.config.get("first_call_only", False)
        if not isinstance(self.first_call_only, bool):
            raise ValueError(f"retail env: first_call_only must be true or false, got {self.first_call_only!r}")
        self.shaping = RetailShaping.from_config(self.config.get("shaping"))
        if self.shaping is not None:
            self.reward_range = self.shaping.reward_range  # type: ignore[misc] - this instance's reward
        self.user = user_simulator or build_user_simulator(self.config.get("user"))
        self._gold: dict[str, GoldReplay] = {}

    def gold(self, task: Mapping[str, Any]) -> GoldReplay:
        """The gold replay of a task, computed once per process."""
        task_id = str(task["id"])
        if task_id not in self._gold:
            self._gold[task_id] = replay_gold(self.data.db, task)
        return self._gold[task_id]

    async def start(self, task: Task) -> RetailEpisode:
        record = self.data.task(task_id_of(task.label, task.metadata))
        if record.get("initial_state"):
            raise ValueError(f"retail task {record['id']}: tasks with an initial_state are not supported")
        session = self.user.session(scenario_text(record.get("user_scenario") or {}))
        first = await session.reply(AGENT_GREETING)  # EpisodeAborted: nothing to train on, the sample is removed
        return RetailEpisode(self, record, session, first)

    def check_label(self, label: Any) -> None:
        """A label names a task of the data directory; none is fine (``metadata.task_id`` may name the task)."""
        if label is None or label == "":
            return
        if isinstance(label, bool) or not isinstance(label, (str, int)):
            raise ValueError(f"a retail label is the task id, got {type(label).__name__} {label!r:.100}")
        self.data.task(str(label))

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` records drawn from the train split of the configured data directory."""
        rows = records(self.data, "train")
        drawn = random.Random(seed).sample(rows, min(n, len(rows)))
        return [{**row, "metadata": {**row["metadata"], "env": self.tag}} for row in drawn]

    @classmethod
    def routing_prompts(cls, n: int, seed: int = 0) -> list[str]:
        """Generated customer messages (:mod:`aclarena_envs.retail.routing`): the demo records need a data folder."""
        return routing.prompts(n, seed)

    async def aclose(self) -> None:
        await self.user.aclose()
