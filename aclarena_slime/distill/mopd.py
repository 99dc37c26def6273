"""Multi-teacher on-policy distillation (MOPD): the teacher that owns a sample's env tag scores its tokens.

The student rolls out on a mixed prompt stream (the rollout's generate hook); for each sample the
teacher of its env tag scores the student's exact tokens, and slime's OPD (``--use-opd --opd-type
sglang``) turns ``log p_student - log p_teacher`` into a per-token reverse-KL advantage. Slime reaches
this module through the ``mopd_reward`` and ``mopd_post_process`` hooks of :mod:`aclarena_slime.slime_edge`.

Teachers are a recipe's ``custom.aclarena_mopd`` (:class:`MopdSettings`):

- ``teachers``: ``{tag: "http://host:port"}`` or ``{tag: {"url": ..., "lora_path": ...}}`` — one server
  (or router) per teacher;
- ``teacher_pool`` + ``teacher_experts``: LoRA experts on one SGLang pool, the adapter of a tag taken
  from an expert manifest (``experts.json`` path) or a ``{tag: adapter}`` mapping; requests carry
  ``lora_path``. Without ``teacher_pool``, slime's ``--rm-url`` names the pool. A tag in ``teachers``
  wins over the pool.
- ``task_reward`` (default false: the reward is 0.0, as the authors ran it — WillDreamer/ACLArena
  ``multi_teacher/opd_multi_teacher.py``; true: the env's own score, group-normalized);
  ``teacher_temperature`` (default slime's ``--rollout-temperature``, as slime's own OPD ``reward_func``).

A teacher that fails (unreachable, a 4xx such as a trajectory over its context length, an answer
that does not line up with the tokens) never becomes a zero reward: the sample is marked ABORTED and
``remove_sample`` (slime zeroes its loss mask) and carries neutral teacher log-probs. A tag with no
teacher at all is a configuration error and raises.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aclarena_slime.experts import ExpertTable, UnknownExpert
from aclarena_slime.rollout import RECORD_KEY
from aclarena_slime.sglang_client import SGLangClient, SGLangError

log = logging.getLogger(__name__)


class TeacherConfigError(ValueError):
    pass


class TeacherAnswerError(RuntimeError):
    """The teacher answered, but not with log-probs for exactly the sample's response tokens."""


@dataclass
class MopdSettings:
    """A recipe's ``custom.aclarena_mopd`` (see the module docstring)."""

    teachers: dict[str, Any] = field(default_factory=dict)  # tag -> url, or {url, lora_path}
    teacher_pool: str | None = None
    teacher_experts: Any = None  # experts.json path, or {tag: adapter}
    task_reward: bool = False
    teacher_temperature: float | None = None


@dataclass(frozen=True)
class Teacher:
    url: str
    lora_path: str | None = None


@dataclass(frozen=True)
class TeacherTable:
    """Which teacher scores which env tag: separate servers and/or LoRA experts on one pool."""

    servers: Mapping[str, Teacher]
    pool_url: str | None = None
    experts: ExpertTable | None = None

    def for_tag(self, tag: str) -> Teacher:
        if tag in self.servers:
            return self.servers[tag]
        if self.experts is not None and self.pool_url:
            try:
                return Teacher(self.pool_url, self.experts.adapter_for(tag))
            except UnknownExpert as exc:
                raise TeacherConfigError(f"no MOPD teacher for env tag {tag!r}: {exc}") from None
        known = ", ".join(sorted(self.servers)) or "(none)"
        raise TeacherConfigError(f"no MOPD teacher for env tag {tag!r}; teachers are configured for: {known}")

    @classmethod
    def from_settings(cls, settings: MopdSettings, rm_url: str | None = None) -> TeacherTable:
        """The table of ``settings``; slime's ``--rm-url`` is the pool when ``teacher_pool`` is unset."""
        parsed: dict[str, Teacher] = {}
        for tag, entry in settings.teachers.items():
            entry = dict(entry) if isinstance(entry, Mapping) else {"url": entry}
            if not entry.get("url"):
                raise TeacherConfigError(f"MOPD teacher for {tag!r} has no url")
            parsed[tag] = Teacher(_base_url(str(entry["url"])), entry.get("lora_path"))
        experts, pool = settings.teacher_experts, settings.teacher_pool or rm_url
        table = None
        if isinstance(experts, Mapping):
            table = ExpertTable.from_mapping(experts)
        elif experts:
            table = ExpertTable.load(str(experts))
        if table is not None and not pool:
            raise TeacherConfigError("aclarena_mopd.teacher_experts needs a pool: aclarena_mopd.teacher_pool or --rm-url")
        if not parsed and table is None:
            raise TeacherConfigError(
                "MOPD needs teachers: aclarena_mopd.teachers, or aclarena_mopd.teacher_experts with a pool"
            )
        return cls(parsed, _base_url(pool) if pool else None, table)


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/generate")] if url.endswith("/generate") else url


async def fill_teacher_log_probs(client: SGLangClient, teacher: Teacher, sample: Any, temperature: float) -> bool:
    """Set ``sample.teacher_log_probs`` from ``teacher`` (``client`` talks to its server); False when it
    failed, in which case the sample is aborted and removed, with neutral log-probs."""
    try:
        sample.teacher_log_probs = await score_response(client, teacher, sample, temperature)
    except (SGLangError, TeacherAnswerError) as exc:
        log.warning("MOPD teacher %s failed on sample %s; dropping it: %s", teacher.url, sample.index, exc)
        abort_sample(sample, f"teacher: {exc}")
        return False
    return True


async def score_response(client: SGLangClient, teacher: Teacher, sample: Any, temperature: float) -> list[float]:
    """The teacher's log-prob of each response token of ``sample``: exactly ``response_length`` values.

    SGLang prefills ``input_ids`` with ``max_new_tokens: 0`` and returns ``meta_info.input_token_logprobs``
    as ``[logprob, token_id, text]`` for positions ``logprob_start_len .. len-1``, the first one ``None``
    (no context predicts it; sglang ``scheduler_output_processor_mixin.py``). Starting one token before
    the response keeps the answer small; the last ``response_length`` entries are then checked against
    the sample's own tokens.
    """
    tokens = [int(t) for t in sample.tokens]
    n = int(sample.response_length)
    if n == 0:
        return []
    if n >= len(tokens):
        raise TeacherAnswerError(f"response_length {n} leaves no prompt in {len(tokens)} tokens")
    params = {"max_new_tokens": 0, "temperature": temperature, "skip_special_tokens": False}
    extra = {"logprob_start_len": len(tokens) - n - 1}
    answer = await client.generate(tokens, params, lora_path=teacher.lora_path, extra=extra)
    return response_log_probs(answer, tokens, n)


def response_log_probs(answer: Any, tokens: Sequence[int], response_length: int) -> list[float]:
    """The last ``response_length`` input log-probs of an SGLang answer, checked against ``tokens``."""
    entries = answer.get("meta_info", {}).get("input_token_logprobs") if isinstance(answer, Mapping) else None
    if not isinstance(entries, list) or len(entries) < response_length:
        got = len(entries) if isinstance(entries, list) else "no"
        raise TeacherAnswerError(f"{got} input log-probs for {response_length} response tokens")
    tail = entries[len(entries) - response_length :]
    expected = list(tokens[len(tokens) - response_length :])
    out: list[float] = []
    for position, (entry, token) in enumerate(zip(tail, expected, strict=True)):
        if not isinstance(entry, (list, tuple)) or len(entry) < 2:
            raise TeacherAnswerError(f"malformed log-prob entry {entry!r}")
        logprob, token_id = entry[0], entry[1]
        if token_id is not None and int(token_id) != token:
            raise TeacherAnswerError(f"response token {position}: teacher scored id {token_id}, the sample has {token}")
        if not isinstance(logprob, (int, float)) or math.isnan(logprob):
            raise TeacherAnswerError(f"response token {position} has no teacher log-prob ({logprob!r})")
        out.append(float(logprob))
    return out


def abort_sample(sample: Any, reason: str) -> None:
    """A teacher failure: the sample is ABORTED and kept out of training."""
    sample.status = type(sample).Status.ABORTED
    drop_sample(sample, reason)


def drop_sample(sample: Any, reason: str) -> None:
    """``remove_sample`` (slime zeroes its loss mask) with neutral teacher log-probs; the reason is recorded."""
    sample.remove_sample = True
    sample.teacher_log_probs = neutral_log_probs(sample)
    if not isinstance(sample.metadata, dict):
        sample.metadata = dict(sample.metadata or {})
    sample.metadata.setdefault(RECORD_KEY, {})["teacher_error"] = reason


def neutral_log_probs(sample: Any) -> list[float]:
    """Teacher log-probs that add no KL signal: the student's own rollout log-probs (zeros if absent)."""
    n = int(sample.response_length)
    own = sample.rollout_log_probs
    if own is not None and len(own) == n:
        return [float(x) for x in own]
    return [0.0] * n


def raw_rewards(samples: list[Any], reward_key: str | None = None) -> list[float]:
    """The samples' rewards, teacher log-probs guaranteed.

    Samples that never reached the reward function (aborted during rollout) get neutral teacher
    log-probs and ``remove_sample``, so slime's batch always has ``response_length`` values per sample;
    their reward counts as 0.0 (slime zeroes their loss mask anyway).
    """
    raw: list[float] = []
    for sample in samples:
        teacher = sample.teacher_log_probs
        if teacher is None or len(teacher) != int(sample.response_length) or sample.reward is None:
            drop_sample(sample, "not scored by a teacher")
        value = sample.reward
        if isinstance(value, Mapping):
            value = value.get(reward_key or "reward")
        raw.append(float(value) if isinstance(value, (int, float)) else 0.0)
    return raw
