"""The search environment: Search-R1's multi-turn retrieve-then-answer loop as an env plugin.

Each model turn ends with ``<search> query </search>`` (answered with the top-k passages inside
``<information>``) or ``<answer> text </answer>`` (the episode ends and is scored by exact match or F1
against the gold answers). Configuration, from the recipe (under slime through
``--custom-config-path``), all keys optional::

    corpus: /data/wiki-18.jsonl     # JSONL {"id", "contents"}; BM25 index cached beside it
    retriever_url: http://127.0.0.1:8000/retrieve   # or a Search-R1 server instead of a corpus
    encoder: my_pkg.enc:encode      # with corpus: dense retrieval (faiss) with this encoder
    dense_index: /data/e5_Flat.index  # optional prebuilt faiss index for the dense retriever
    e5_model: /models/e5-base-v2    # with corpus: E5 dense retrieval (the authors'), instead of encoder
    topk: 3                         # passages per search (Search-R1: 3)
    max_turns: 5                    # model turns per episode (Search-R1: at most 5)
    reward: em                      # em | f1 | shaped (the authors' -0.2..1.0 table; protocol tool_call)
    protocol: search_r1             # search_r1 tags | tool_call (the authors' JSON <tool_call>, tool messages)
    format_score: 0.0               # Search-R1's structure bonus (their runs: 0.2)
    max_query_chars: 512            # longer queries get a notice instead of a search
    max_turn_chars: 65536           # a longer model turn is not parsed: it gets a notice (an invalid turn)
    breakdown_answer_chars: 1000    # the answer kept in the score breakdown (sample metadata) is cut here
    instruction: "...{question}..." # wraps bare-question prompts; default Search-R1's; "" = as is

With neither ``corpus`` nor ``retriever_url``, the generated demo corpus is used (and the log says so).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aclarena_slime.plugin.contract import (
    Conversation,
    Done,
    Environment,
    Episode,
    EpisodeAborted,
    Observation,
    Score,
    Task,
)

from . import data, demo_corpus
from .config import SearchConfig
from .protocol import (
    INVALID_ACTION,
    STOP_STRINGS,
    format_information,
    format_notice,
    make_prompt,
    parse_action,
)
from .retriever import BM25Retriever, DenseRetriever, RemoteRetriever, Retriever, RetrieverError
from .reward import exact_match, f1, gold_answers, trajectory_reward

if TYPE_CHECKING:
    from .tool_episode import ToolSearchEpisode

log = logging.getLogger(__name__)


def build_retriever(cfg: SearchConfig) -> Retriever:
    """The one place that turns configuration into a retriever (blocking: may build an index)."""
    if cfg.retriever_url:
        return RemoteRetriever(
            cfg.retriever_url, cfg.retriever_timeout_s, retries=cfg.retriever_retries, max_bytes=cfg.retriever_max_bytes
        )
    if cfg.corpus and (cfg.encoder or cfg.e5_model):
        from .e5 import dense_encoder  # the dense retriever's encoder: loaded by the runs that use one

        return DenseRetriever.from_corpus(cfg.corpus, dense_encoder(cfg), index_path=cfg.dense_index)
    if cfg.corpus:
        return BM25Retriever.from_corpus(cfg.corpus)
    log.warning(
        "search env: no corpus or retriever_url configured; using the generated demo corpus (%d fictional passages)",
        demo_corpus.DEMO_PASSAGES,
    )
    return BM25Retriever.from_documents(demo_corpus.generate(demo_corpus.DEMO_PASSAGES).passages)


class SearchEpisode(Episode):
    """One question: the model's turns, its searches and its final answer."""

    def __init__(self, env: SearchEnvironment, task: Task, golds: list[str]) -> None:
        self.env, self.golds = env, golds
        if isinstance(task.prompt, list):  # already a conversation (e.g. Search-R1's own parquet)
            messages = [dict(m) for m in task.prompt]
        else:
            messages = [{"role": "user", "content": make_prompt(str(task.prompt), env.cfg.instruction)}]
        self.conversation = Conversation(messages)
        self.turns = 0
        self.searches = 0
        self.invalid_turns = 0
        self.answer: str | None = None

    async def step(self, text: str) -> Observation | Done:
        cfg = self.env.cfg
        self.turns += 1
        if len(text) > cfg.max_turn_chars:  # bounded work per turn whatever the model wrote
            self.invalid_turns += 1
            if self.turns >= cfg.max_turns:
                return Done("max_turns")
            return self._notice(
                f"Your turn was {len(text)} characters long; the limit is {cfg.max_turn_chars}. "
                "Search with <search> query </search> or answer with <answer> text </answer>."
            )
        action = parse_action(text)
        if action.kind == "answer":
            self.answer = action.content
            return Done("answer")
        if self.turns >= cfg.max_turns:  # no further turn would read an observation
            if action.kind is None:
                self.invalid_turns += 1
            return Done("max_turns")
        if action.kind is None:
            self.invalid_turns += 1
            return Observation([{"role": "user", "content": f"\n{INVALID_ACTION}\n"}])
        query = action.content
        if not query:
            self.invalid_turns += 1
            return self._notice("The search query was empty. Put the query between <search> and </search>.")
        if len(query) > cfg.max_query_chars:
            self.invalid_turns += 1
            return self._notice(
                f"The search query was {len(query)} characters long; the limit is {cfg.max_query_chars}. "
                "Search with a few keywords."
            )
        self.searches += 1
        try:
            [hits] = await (await self.env.retriever()).retrieve([query], cfg.topk)
        except RetrieverError as exc:
            raise EpisodeAborted(f"search retriever failed: {exc}") from exc
        return Observation([{"role": "user", "content": format_information([h.document for h in hits])}])

    def _notice(self, message: str) -> Observation:
        return Observation([{"role": "user", "content": format_notice(message)}])

    async def score(self) -> Score:
        cfg = self.env.cfg
        answer = self.answer
        em = exact_match(answer, self.golds) if answer is not None else 0.0
        f1_value = f1(answer, self.golds) if answer is not None else 0.0
        well_formed = answer is not None and self.invalid_turns == 0
        correctness = em if cfg.reward == "em" else f1_value
        reward = trajectory_reward(correctness, well_formed, cfg.format_score)
        cut = cfg.breakdown_answer_chars
        return Score(
            reward,
            {
                "answer": answer if answer is None or len(answer) <= cut else answer[:cut],
                "gold": self.golds,
                "em": em,
                "f1": f1_value,
                "well_formed": well_formed,
                "turns": self.turns,
                "searches": self.searches,
                "invalid_turns": self.invalid_turns,
            },
        )


class SearchEnvironment(Environment):
    """Search-R1 question answering with a retriever; tag ``search``."""

    tag = "search"
    stop = STOP_STRINGS
    prepare_data = "aclarena_envs.search.data.main"

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        super().__init__(config)
        self.cfg = SearchConfig.from_mapping(self.config)
        self.max_turns = self.cfg.max_turns
        self._episode: type[SearchEpisode] | type[ToolSearchEpisode] = SearchEpisode
        if self.cfg.protocol == "tool_call":  # its modules (episode, format, shaped rewards) load only for it
            from .tool_episode import ToolSearchEpisode, protocol_settings

            self._episode = ToolSearchEpisode
            self.stop, reward_range = protocol_settings(self.cfg)
            if reward_range is not None:
                self.reward_range = reward_range  # type: ignore[misc] - this instance's reward, not the class's
        self._retriever: Retriever | None = None
        self._build_lock = threading.Lock()  # not an asyncio lock: the env may outlive one event loop

    async def retriever(self) -> Retriever:
        """Built on first use, off the event loop: an index build must not stall other episodes."""
        if self._retriever is None:
            await asyncio.to_thread(self._build_once)
        assert self._retriever is not None
        return self._retriever

    def _build_once(self) -> None:
        with self._build_lock:
            if self._retriever is None:
                self._retriever = build_retriever(self.cfg)

    async def start(self, task: Task) -> Episode:
        return self._episode(self, task, gold_answers(task.label_value))

    def check_label(self, label: Any) -> None:
        """The label holds gold answers (see :func:`~.reward.gold_answers`); offline, the retriever is not built."""
        gold_answers(label)

    def demo_records(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """Questions about the generated demo corpus, the one this env searches when none is configured.

        ``seed`` shuffles which questions are drawn; the corpus itself is always the default one, so
        every question is answerable from what the embedded retriever holds.
        """
        if self.cfg.corpus or self.cfg.retriever_url:
            raise NotImplementedError("demo records only match the demo corpus; name a dataset for your corpus")
        questions = list(demo_corpus.generate(demo_corpus.DEMO_PASSAGES).questions)
        random.Random(seed).shuffle(questions)
        return list(data.demo_records(questions[:n], "demo", self.tag))

    @classmethod
    def routing_prompts(cls, n: int, seed: int = 0) -> list[str]:
        """Half the demo records' prompts, half open-domain questions (:mod:`aclarena_envs.search.routing`)."""
        from . import routing  # the router's training prompts: only the router asks for them

        demo = super().routing_prompts(n // 2, seed)
        return demo + routing.prompts(n - len(demo), seed)

    async def aclose(self) -> None:
        if self._retriever is not None:
            await self._retriever.aclose()
            self._retriever = None
