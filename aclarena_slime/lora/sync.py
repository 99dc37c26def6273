"""Adapter-only weight sync to SGLang servers, through :func:`aclarena_slime.adapter_swap.swap_adapter`.

SGLang has no in-place LoRA update: each RL step either unloads the expert and loads it again under
the same name inside a pause (every load gets a fresh internal id, so no stale prefix-cache entry is
reused), or, versioned, loads ``name@N`` beside the versions still in use. The adapter travels either
as a PEFT directory (``/load_lora_adapter``; the default) or as tensors
(``/load_lora_adapter_from_tensors``).

Disk mode writes ``<sync_dir>/<name>`` (versioned: ``<sync_dir>/<name>@N``) atomically before the load; ``sync_dir`` must be readable by every
server (on several nodes, a shared filesystem). ``<sync_dir>/<name>`` is also the stage's exported expert:
a versioned sync publishes each version there too (atomically, once every server has loaded it), so the
stage's adapter check, the monitor's ``keep`` and the curriculum find the current expert under its plain
name. A retired version's folder is renamed away before any server unloads it: SGLang 0.5.15 remembers
every adapter it loaded and reloads an unloaded one from its folder when a late request names it
(:mod:`aclarena_slime.sglang_errors`); with the folder gone it refuses instead of serving stale weights.

Tensors mode, payload of ``/load_lora_adapter_from_tensors`` (sglang ``managers/io_struct.py``):
- up to 0.5.15: ``serialized_tensors`` is one base64 string;
- later releases (0.5.18 and 0.5.23 checked): ``serialized_named_tensors`` is a list with one
  base64 blob per server TP rank.
Both hold SGLang's ``MultiprocessingSerializer`` encoding (torch's ``ForkingPickler``), which passes
tensor storage by reference, not by value: CPU storage through the sending process's resource sharer
(a separate SGLang process fails with ``AuthenticationError``), CUDA storage through CUDA IPC (same host
only). This mode has not been checked against a real SGLang server; use it only after doing so.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import re
import shutil
import time
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch
import torch.multiprocessing  # noqa: F401  registers torch's shared-memory reductions on ForkingPickler

from aclarena_slime.adapter_swap import AdapterLedger, AdapterSwapError, files_checksum, swap_adapter, versioned_name
from aclarena_slime.sglang_client import RetryPolicy, SGLangClient, SGLangError

from .export import peft_files, write_peft_dir

# Last release with the single-string ``serialized_tensors`` field.
_LAST_STRING_PAYLOAD = (0, 5, 15)


class AdapterSyncError(RuntimeError):
    """A server refused the adapter; the message names the server and its answer."""


@dataclass(frozen=True)
class SyncResult:
    """What one sync did, for slime's metrics."""

    servers: int
    payload_bytes: int
    seconds: float
    schema: str
    served: str = ""
    checksum: str | None = None


def serialize_tensors(tensors: dict[str, torch.Tensor]) -> str:
    """Encode like SGLang's ``MultiprocessingSerializer.serialize(obj, output_str=True)``."""
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump({k: v.contiguous() for k, v in tensors.items()})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def payload_schema_for(version: str) -> str:
    """Which tensors field a server of this ``sglang`` version expects."""
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:3])
    if len(numbers) < 3:
        raise AdapterSyncError(f"cannot read an SGLang version from {version!r}; set lora sglang_payload explicitly")
    return "serialized_tensors" if numbers <= _LAST_STRING_PAYLOAD else "serialized_named_tensors"


def tensors_payload(
    name: str, tensors: dict[str, torch.Tensor], config_dict: dict, schema: str, tp_size: int, pinned: bool = False
) -> dict:
    """The JSON body of ``/load_lora_adapter_from_tensors`` for the given schema."""
    blob = serialize_tensors(tensors)
    body = {"lora_name": name, "config_dict": config_dict, "pinned": pinned}
    if schema == "serialized_tensors":
        body["serialized_tensors"] = blob
    elif schema == "serialized_named_tensors":
        body["serialized_named_tensors"] = [blob] * tp_size
    else:
        raise AdapterSyncError(f"unknown SGLang payload schema {schema!r}")
    return body


async def _server_info(client: SGLangClient) -> dict:
    try:
        return await client.get("/get_server_info")
    except SGLangError as exc:
        raise AdapterSyncError(str(exc)) from exc


async def sync_adapter(
    urls: list[str],
    name: str,
    tensors: dict[str, torch.Tensor],
    config_dict: dict,
    *,
    mode: str = "disk",
    sync_dir: str | None = None,
    schema: str = "auto",
    pinned: bool = False,
    timeout_s: float = 600.0,
    pause_mode: str = "abort",
    version: int | None = None,
    staleness_budget: int = 0,
) -> SyncResult:
    """Put ``tensors`` (PEFT names, full unsharded tensors) on every server as adapter ``name``.

    ``version=None``: replace ``name`` in place inside ``/pause_generation`` (``pause_mode``; see
    ``LoraConfig.pause_mode``). ``version=N``: load ``name@N`` beside the resident versions, written to
    ``<sync_dir>/name@N``, and unload those more than ``staleness_budget`` syncs old (see
    :mod:`aclarena_slime.adapter_swap`). In disk mode the folder read back must match the checksum of
    the bytes meant for it before any server loads it.

    One attempt per request (``RetryPolicy(attempts=1)``): a load is not idempotent across a half-done swap.
    """
    start = time.perf_counter()
    clients = [SGLangClient(url, RetryPolicy(attempts=1, timeout_s=timeout_s)) for url in urls]
    payload_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    served = name if version is None else versioned_name(name, version)
    ledger = AdapterLedger(sync_dir) if version is not None and sync_dir else None
    if version is not None and ledger is None:
        raise AdapterSyncError("a versioned sync needs sync_dir (the ledger rollouts read lives there)")
    path: Path | None = None
    load: tuple[str, list[dict]] | None = None
    checksum: str | None = None
    if mode == "disk":
        if not sync_dir:
            raise AdapterSyncError("disk sync needs sync_dir")
        checksum = files_checksum(peft_files(tensors, config_dict))
        path = write_peft_dir(Path(sync_dir) / served, tensors, config_dict)
        used = "peft_dir"
    else:
        infos = await asyncio.gather(*(_server_info(client) for client in clients))
        used = schema
        bodies = []
        for info in infos:
            server_schema = schema if schema != "auto" else payload_schema_for(str(info.get("version", "")))
            used = server_schema
            tp_size = int(info.get("tp_size", 1) or 1)
            bodies.append(tensors_payload(served, tensors, config_dict, server_schema, tp_size, pinned))
        load = ("/load_lora_adapter_from_tensors", bodies)
    try:
        result = await swap_adapter(
            clients,
            name,
            path,
            version=version,
            staleness_budget=staleness_budget,
            ledger=ledger,
            checksum=checksum,
            pinned=pinned,
            pause_mode=pause_mode,
            load=load,
            retiring=(lambda old: _retire_folder(Path(sync_dir), old)) if sync_dir else None,
        )
    except AdapterSwapError as exc:
        raise AdapterSyncError(str(exc)) from exc
    if sync_dir and result.unloaded:
        for old in result.unloaded:  # unloaded everywhere: its folder is no longer read
            shutil.rmtree(_retired(Path(sync_dir), old), ignore_errors=True)
    if version is not None and mode == "disk":
        assert sync_dir is not None
        write_peft_dir(Path(sync_dir) / name, tensors, config_dict)  # the current version, under the plain name
    return SyncResult(len(urls), payload_bytes, time.perf_counter() - start, used, result.served, checksum)


def _retired(sync_dir: Path, served: str) -> Path:
    """Where a retired version's folder waits for its unload: a hidden name no engine was told of."""
    return sync_dir / f".{served}.retired"


def _retire_folder(sync_dir: Path, served: str) -> None:
    """Rename ``<sync_dir>/<served>`` away before the engines unload it, so none can reload it implicitly."""
    source, target = sync_dir / served, _retired(sync_dir, served)
    shutil.rmtree(target, ignore_errors=True)  # a crashed sync's leftover
    try:
        os.rename(source, target)
    except FileNotFoundError:  # tensors mode, or a resumed run that renamed it already
        pass
