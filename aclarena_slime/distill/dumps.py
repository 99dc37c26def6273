"""Reading rollout dumps into plain episodes: the conversation, its reward, its status and its domain.

Two sources, one shape (:class:`DumpedEpisode`):

- slime's ``--save-debug-rollout-data`` files (``{dump_details}/rollout_data/{rollout_id}.pt``): a torch
  file ``{"rollout_id": ..., "samples": [Sample.to_dict(), ...]}`` (slime
  ``slime/observability/rollout_data_utils.py``, ``save_debug_rollout_data``);
- JSONL, one object per line: the evaluation's per-sample lines, a previous mixture, or any record
  with ``messages`` and ``reward``.

Our rollout keeps the whole conversation in ``metadata["aclarena"]`` (``messages``, ``tools``,
``score``): that is the source of truth. A sample from another generate function falls back to its
chat ``prompt`` plus ``response`` (single turn). Nothing is guessed beyond that: an episode whose
conversation cannot be recovered has ``messages=None`` and the filter counts it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aclarena_slime.jsonl import JsonlError, iter_jsonl

DUMP_SUFFIXES = (".pt", ".jsonl")
RECORD_KEY = "aclarena"  # where aclarena_slime.rollout keeps the episode record in sample.metadata


class DumpError(ValueError):
    pass


@dataclass(frozen=True)
class DumpedEpisode:
    source: str  # "file:index" (slime dump) or "file:line" (JSONL), for error messages and provenance
    domain: str | None
    messages: list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None
    reward: float | None
    status: str
    trainable_tokens: int | None = None  # loss-mask-1 tokens (0 when slime drops the sample); None: not recorded
    length: int | None = None  # prompt + response tokens, when recorded


def dump_files(paths: Iterable[str | Path]) -> list[Path]:
    """The dump files named by ``paths``: files as given, folders searched for ``*.pt`` / ``*.jsonl``."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in DUMP_SUFFIXES)
            if not found:
                raise DumpError(f"{path} holds no rollout dumps (*.pt or *.jsonl)")
            files += found
        elif path.is_file():
            if path.suffix not in DUMP_SUFFIXES:
                raise DumpError(f"{path}: not a rollout dump (expected a slime .pt dump or .jsonl)")
            files.append(path)
        else:
            raise DumpError(f"{path} does not exist")
    return files


def read_dump(path: str | Path, domain: str | None = None, trust_pickle: bool = False) -> Iterator[DumpedEpisode]:
    """Episodes of one dump file; ``domain`` overrides the domain the records name."""
    path = Path(path)
    if path.suffix == ".pt":
        for index, sample in enumerate(_slime_samples(path, trust_pickle)):
            if not isinstance(sample, Mapping):
                raise DumpError(f"{path}: sample {index} is a {type(sample).__name__}, not a Sample.to_dict() dict")
            yield episode_from_record(sample, f"{path}:{index}", domain)
        return
    try:
        for number, record in iter_jsonl(path):
            yield episode_from_record(record, f"{path}:{number}", domain)
    except JsonlError as exc:
        raise DumpError(str(exc)) from None


def _slime_samples(path: Path, trust_pickle: bool) -> list[Any]:
    import pickle
    import zipfile

    import torch

    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive since torch 1.6
        raise DumpError(f"{path}: cannot be read as a slime rollout dump (not a torch.save file)")
    try:
        # Plain containers and tensors only, unless the user vouches for the file (it is a pickle).
        data = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as exc:
        detail = next((line for line in str(exc).splitlines() if "Unsupported" in line), "unsupported objects")
        raise DumpError(
            f"{path}: holds objects beyond plain values and tensors ({detail.strip()}); "
            "if you made this dump yourself, read it with trust_pickle (CLI: --trust-pickle)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a broken file
        raise DumpError(f"{path}: cannot be read as a slime rollout dump ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("samples"), list):
        raise DumpError(f"{path}: not a slime rollout dump (expected a dict with a 'samples' list)")
    return data["samples"]


def episode_from_record(record: Mapping[str, Any], source: str, domain: str | None = None) -> DumpedEpisode:
    """One episode from a ``Sample.to_dict()`` or a JSONL record; fields that are missing stay None."""
    metadata = _mapping(record.get("metadata"), source, "metadata")
    ours = _mapping(metadata.get(RECORD_KEY), source, f"metadata.{RECORD_KEY}")
    messages = ours.get("messages") or record.get("messages")
    if not messages and isinstance(record.get("prompt"), list) and record.get("response"):
        messages = [*record["prompt"], {"role": "assistant", "content": record["response"]}]
    tools = ours.get("tools") or record.get("tools") or metadata.get("tools")
    tag = domain or metadata.get("domain") or metadata.get("env") or record.get("domain") or record.get("env")
    return DumpedEpisode(
        source=source,
        domain=str(tag) if tag else None,
        messages=list(messages) if isinstance(messages, list) and messages else None,
        tools=list(tools) if isinstance(tools, list) and tools else None,
        reward=_reward(ours, record),
        status=_status(record.get("status")),
        trainable_tokens=_trainable(record),
        length=len(record["tokens"]) if isinstance(record.get("tokens"), list | tuple) else None,
    )


def _trainable(record: Mapping[str, Any]) -> int | None:
    """Tokens the sample trains on: 0 for a sample slime removes (``remove_sample``) or an all-zero loss mask."""
    if record.get("remove_sample"):
        return 0
    mask = record.get("loss_mask")
    if hasattr(mask, "tolist"):
        mask = mask.tolist()
    return int(sum(mask)) if isinstance(mask, list | tuple) else None


def _mapping(value: Any, source: str, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):  # slime JSONL may carry metadata as a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise DumpError(f"{source}: {what} is a string but not JSON") from None
    if not isinstance(value, Mapping):
        raise DumpError(f"{source}: {what} must be an object, got {type(value).__name__}")
    return value


def _reward(ours: Mapping[str, Any], record: Mapping[str, Any]) -> float | None:
    score = ours.get("score")
    candidates = [score.get("reward") if isinstance(score, Mapping) else None, record.get("reward")]
    for value in candidates:
        if isinstance(value, Mapping):  # a reward model that returned a dict (slime's --reward-key)
            value = value.get("reward")
        if hasattr(value, "item"):  # a 0-d tensor
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _status(value: Any) -> str:
    if value is None:
        return "completed"  # JSONL records without a status are finished conversations
    return str(getattr(value, "value", value)).lower()
