"""SDFT data, as the authors ran it: oracle rollouts → kept by reward per domain → one chat-SFT mixture.

Each kept episode becomes one slime SFT record::

    {"messages": [...], "tools": [...], "metadata": {"domain": "search", "source_name": "search", ...}}

``messages`` is the whole conversation as the rollout saw it (system/user prompt, every assistant
turn verbatim, tool results and env observations), so slime's multi-turn loss mask
(``--loss-mask-type qwen3``) trains the assistant turns only. ``tools`` (omitted when empty) is the
schema list the chat template renders. ``metadata.domain`` is what the balanced data source
(:mod:`aclarena_slime.distill.balanced_source`) balances on; ``metadata.source_name`` makes slime log its metrics per domain.

Kept means: a finished episode (status ``completed`` by default; ``statuses`` widens it, e.g. the
authors' search warm start also keeps truncated ones), a reward ``>=`` its domain's threshold, at least
one token to train on (a sample slime would drop, or whose loss mask is all zero, never), at most
``max_tokens`` tokens when set, a well-formed conversation that ends with an assistant turn, and not an
exact duplicate of a record already kept. ``max_per_prompt`` caps how many distinct trajectories of one
prompt survive (oracles sample 8-16 per prompt).

The same pipeline makes the SFT warm starts of the sequential chain (the authors' SeaSFT and TauSFT: a
teacher's rollouts filtered by reward, status and trainable tokens); see ``recipes/data/*_sft.yaml``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aclarena_slime.distill.dumps import DumpedEpisode
from aclarena_slime.jsonl import write_jsonl_atomic

__all__ = [
    "DomainCounts",
    "MixtureError",
    "MixtureReport",
    "MixtureSettings",
    "build_mixture",
    "chat_messages",
    "write_mixture",
]

ROLES = frozenset({"system", "user", "assistant", "tool"})
# Message fields chat templates read; anything else a rollout attached (ids, timings) is dropped.
MESSAGE_FIELDS = ("role", "content", "reasoning_content", "tool_calls", "tool_call_id", "name")
KEPT_STATUS = "completed"
STATUSES = ("completed", "truncated", "aborted", "failed")


class MixtureError(ValueError):
    pass


@dataclass(frozen=True)
class MixtureSettings:
    thresholds: Mapping[str, float] = field(default_factory=dict)  # per domain
    default_threshold: float | None = None  # for domains without their own
    max_per_prompt: int | None = None
    statuses: tuple[str, ...] = (KEPT_STATUS,)  # episode statuses that may be kept
    max_tokens: int | None = None  # prompt + response, when the dump records tokens

    def __post_init__(self) -> None:
        unknown = sorted(set(self.statuses) - set(STATUSES))
        if not self.statuses or unknown:
            raise MixtureError(f"statuses must be some of {', '.join(STATUSES)}; got {list(self.statuses)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise MixtureError(f"max_tokens must be at least 1, got {self.max_tokens}")

    def threshold(self, domain: str) -> float:
        if domain in self.thresholds:
            return float(self.thresholds[domain])
        if self.default_threshold is None:
            raise MixtureError(f"no reward threshold for domain {domain!r}; give one for it or a default")
        return float(self.default_threshold)


@dataclass
class DomainCounts:
    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> count


@dataclass
class MixtureReport:
    domains: dict[str, DomainCounts] = field(default_factory=dict)

    def count(self, domain: str) -> DomainCounts:
        return self.domains.setdefault(domain, DomainCounts())

    def to_dict(self) -> dict[str, Any]:
        return {
            domain: {"read": c.read, "kept": c.kept, "dropped": dict(sorted(c.dropped.items()))}
            for domain, c in sorted(self.domains.items())
        }


def build_mixture(episodes: Iterable[DumpedEpisode], settings: MixtureSettings) -> tuple[list[dict], MixtureReport]:
    """Filter, convert and de-duplicate; records keep the order of ``episodes``."""
    report = MixtureReport()
    records: list[dict] = []
    seen: set[str] = set()
    per_prompt: Counter = Counter()
    for episode in episodes:
        if not episode.domain:
            raise MixtureError(f"{episode.source}: no domain (metadata.env); name the dump's domain explicitly")
        counts = report.count(episode.domain)
        counts.read += 1
        reason = _rejection(episode, settings)
        messages = chat_messages(episode.messages) if reason is None else None
        if reason is None and messages is None:
            reason = "malformed_messages"
        if reason is None:
            key = _digest([episode.domain, messages, episode.tools])
            prompt = _digest([episode.domain, _prompt_part(messages), episode.tools])
            if key in seen:
                reason = "duplicate"
            elif settings.max_per_prompt is not None and per_prompt[prompt] >= settings.max_per_prompt:
                reason = "prompt_cap"
            else:
                seen.add(key)
                per_prompt[prompt] += 1
        if reason is not None:
            counts.dropped[reason] += 1
            continue
        counts.kept += 1
        records.append(_record(episode, messages))
    return records, report


def _rejection(episode: DumpedEpisode, settings: MixtureSettings) -> str | None:
    if episode.status not in settings.statuses:
        return f"status_{episode.status}"
    if episode.messages is None:
        return "no_messages"
    if episode.reward is None:
        return "no_reward"
    if episode.reward < settings.threshold(episode.domain):
        return "below_threshold"
    if episode.trainable_tokens == 0:
        return "no_trainable_tokens"
    if settings.max_tokens is not None and episode.length is not None and episode.length > settings.max_tokens:
        return "too_long"
    return None


def chat_messages(messages: list[Any] | None) -> list[dict[str, Any]] | None:
    """Chat-template-ready messages, or None when malformed; trailing non-assistant turns are cut."""
    if not messages:
        return None
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") not in ROLES:
            return None
        content = message.get("content")
        if content is None:
            content = ""  # an assistant turn that only calls tools
        if not isinstance(content, str):
            return None  # multimodal content lists are not supported by this pipeline
        clean = {"role": message["role"], "content": content}
        clean.update({k: message[k] for k in MESSAGE_FIELDS[2:] if message.get(k) is not None})
        out.append(clean)
    while out and out[-1]["role"] != "assistant":
        out.pop()
    if not any(m["role"] == "assistant" for m in out):
        return None
    return out


def _prompt_part(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:first]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _record(episode: DumpedEpisode, messages: list[dict[str, Any]]) -> dict[str, Any]:
    record: dict[str, Any] = {"messages": messages}
    if episode.tools:
        record["tools"] = episode.tools
    record["metadata"] = {
        "domain": episode.domain,
        "source_name": episode.domain,
        "reward": episode.reward,
        "origin": episode.source,
    }
    return record


def write_mixture(records: list[dict], out: str | Path, overwrite: bool = False) -> Path:
    """Write JSONL atomically (a crash never leaves half a file); refuses to replace one unless told."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise MixtureError(f"{out} exists; choose another path or allow overwriting")
    write_jsonl_atomic(records, out)
    return out
