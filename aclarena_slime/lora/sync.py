"""Adapter-only weight sync to SGLang servers: pause, unload, load the new adapter, resume.

SGLang has no in-place LoRA update, so each RL step unloads the expert and loads it again under the
same name (every load gets a fresh internal id, so no stale prefix-cache entry is reused). The
adapter travels either as tensors (``/load_lora_adapter_from_tensors``) or as a PEFT directory on a
filesystem every server can read (``/load_lora_adapter``).

Payload of ``/load_lora_adapter_from_tensors`` (sglang ``managers/io_struct.py``):
- up to 0.5.15: ``serialized_tensors`` is one base64 string;
- later releases (0.5.18 and 0.5.23 checked): ``serialized_named_tensors`` is a list with one
  base64 blob per server TP rank.
Both hold SGLang's ``MultiprocessingSerializer`` encoding (torch's ``ForkingPickler``), which passes
tensor storage by shared memory: the tensors mode only works when trainer and server share a host.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import re
import time
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import aiohttp
import torch
import torch.multiprocessing  # noqa: F401  registers torch's shared-memory reductions on ForkingPickler

from .export import write_peft_dir

logger = logging.getLogger(__name__)
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


async def _post(session: aiohttp.ClientSession, url: str, endpoint: str, body: dict) -> dict:
    async with session.post(f"{url}/{endpoint}", json=body) as response:
        text = await response.text()
        try:
            answer = await response.json(content_type=None) if text else {}
        except ValueError:
            answer = {"error_message": text}
        if response.status >= 400 or (isinstance(answer, dict) and answer.get("success") is False):
            raise AdapterSyncError(f"{url}/{endpoint}: HTTP {response.status}: {text[:300]}")
        return answer if isinstance(answer, dict) else {}


async def _server_info(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(f"{url}/get_server_info") as response:
        if response.status >= 400:
            raise AdapterSyncError(f"{url}/get_server_info: HTTP {response.status}")
        return await response.json(content_type=None)


async def _swap_on(session: aiohttp.ClientSession, url: str, name: str, endpoint: str, body: dict) -> None:
    await _post(session, url, "pause_generation", {})
    try:
        try:
            await _post(session, url, "unload_lora_adapter", {"lora_name": name})
        except AdapterSyncError as exc:  # first sync: nothing loaded under this name yet
            logger.info("unload of %r skipped: %s", name, exc)
        await _post(session, url, endpoint, body)
    finally:
        await _post(session, url, "continue_generation", {})


async def sync_adapter(
    urls: list[str],
    name: str,
    tensors: dict[str, torch.Tensor],
    config_dict: dict,
    *,
    mode: str = "tensors",
    sync_dir: str | None = None,
    schema: str = "auto",
    pinned: bool = False,
    timeout_s: float = 600.0,
) -> SyncResult:
    """Replace adapter ``name`` on every server with ``tensors`` (PEFT names, full unsharded tensors)."""
    start = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        bodies: list[tuple[str, dict]] = []
        payload_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        if mode == "disk":
            if not sync_dir:
                raise AdapterSyncError("disk sync needs sync_dir")
            path = write_peft_dir(Path(sync_dir) / name, tensors, config_dict)
            body = {"lora_name": name, "lora_path": str(path), "pinned": pinned}
            bodies = [("load_lora_adapter", body)] * len(urls)
            used = "peft_dir"
        else:
            infos = await asyncio.gather(*(_server_info(session, url) for url in urls))
            used = schema
            for info in infos:
                server_schema = schema if schema != "auto" else payload_schema_for(str(info.get("version", "")))
                used = server_schema
                tp_size = int(info.get("tp_size", 1) or 1)
                body = tensors_payload(name, tensors, config_dict, server_schema, tp_size, pinned)
                bodies.append(("load_lora_adapter_from_tensors", body))
        await asyncio.gather(
            *(_swap_on(session, url, name, endpoint, body) for url, (endpoint, body) in zip(urls, bodies, strict=True))
        )
    return SyncResult(len(urls), payload_bytes, time.perf_counter() - start, used)
