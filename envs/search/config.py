"""The search env's settings, :class:`SearchConfig`, and every check of them in one place.

The env, the E5 encoder, the tool-call episode and ``aclarena serve-retriever`` all read a
``SearchConfig``; none of them re-checks it, so a bad value is refused once, at construction,
with the key it names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aclarena_slime.plugin.settings import from_mapping

from .protocol import INSTRUCTION
from .reward import REWARDS

PROTOCOLS = ("search_r1", "tool_call")
SHAPED = (
    "shaped",
    "shaped_effective",
)  # the tool-call protocol's rewards (the documented table, the authors' effective one)


@dataclass(frozen=True)
class SearchConfig:
    """The env's settings, checked once; defaults follow the Search-R1 paper (top-3, at most 5 turns)."""

    corpus: str | None = None
    retriever_url: str | None = None
    encoder: str | None = None
    dense_index: str | None = None
    topk: int = 3
    max_turns: int = 5
    reward: str = "em"
    format_score: float = 0.0
    max_query_chars: int = 512
    max_turn_chars: int = 65_536
    breakdown_answer_chars: int = 1000
    retriever_timeout_s: float = 30.0
    retriever_retries: int = 3  # a failed or reset connection is tried again this many times, with back-off
    retriever_max_bytes: int = 4 << 20  # the most of a reply the client reads (a top-3 of passages is a few KB)
    instruction: str = INSTRUCTION
    e5_model: str | None = None  # with corpus: E5 dense retrieval (e5.py), the authors' retriever
    protocol: str = "search_r1"  # or "tool_call": the ACLArena authors' JSON tool call (tool_episode.py)

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> SearchConfig:
        """Raises ValueError naming the key for unknown keys and bad values."""
        cfg = from_mapping(cls, config, "config keys of the search env")
        for name in ("topk", "max_turns", "max_query_chars", "max_turn_chars", "breakdown_answer_chars",
                     "retriever_max_bytes"):  # fmt: skip
            value = getattr(cfg, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"search env: {name} must be a positive integer, got {value!r}")
        retries = cfg.retriever_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"search env: retriever_retries must be an integer >= 0, got {retries!r}")
        if cfg.reward not in REWARDS:
            raise ValueError(f"search env: reward must be one of {REWARDS}, got {cfg.reward!r}")
        if (
            isinstance(cfg.format_score, bool)
            or not isinstance(cfg.format_score, (int, float))
            or not 0 <= cfg.format_score <= 1
        ):
            raise ValueError(f"search env: format_score must be a number in [0, 1], got {cfg.format_score!r}")
        if cfg.corpus and cfg.retriever_url:
            raise ValueError("search env: set corpus (embedded retriever) or retriever_url (remote), not both")
        if not isinstance(cfg.instruction, str) or (cfg.instruction and "{question}" not in cfg.instruction):
            raise ValueError("search env: instruction must be a string holding {question}, or empty")
        if (cfg.encoder or cfg.dense_index) and not cfg.corpus:
            raise ValueError("search env: encoder/dense_index need a corpus")
        if cfg.e5_model and not cfg.corpus:
            raise ValueError("search env: e5_model needs a corpus (the passages the index holds)")
        if cfg.e5_model and cfg.encoder:
            raise ValueError("search env: set e5_model or encoder, not both")
        if cfg.protocol not in PROTOCOLS:
            raise ValueError(f"search env: protocol must be one of {PROTOCOLS}, got {cfg.protocol!r}")
        if cfg.reward in SHAPED and cfg.protocol != "tool_call":
            raise ValueError(
                f"search env: reward {cfg.reward!r} is the authors' tool-call reward; set protocol: tool_call"
            )
        return cfg
