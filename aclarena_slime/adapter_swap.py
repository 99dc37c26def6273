"""The one way an adapter is put on SGLang engines: plain or versioned, with a ledger the rollout reads.

Every caller that changes what an engine serves comes through :func:`swap_adapter`: the slime weight
sync (:mod:`aclarena_slime.lora.sync`), the local runner, evaluation's expert loading and the router
pool. Two ways of naming:

- **plain** (``version=None``): the adapter keeps one name (``search``); a new version is an unload,
  then a load (SGLang has no in-place update), optionally inside ``/pause_generation`` so no request
  sees the name missing. Slime's synchronous ``train.py`` needs nothing more. A new version from a
  folder is first loaded under a temporary name (``search.incoming``) and unloaded again, so a damaged
  folder is refused while the old version still serves, not after it was unloaded.
- **versioned** (``version=12``): the adapter is loaded under ``search@12`` next to the versions
  before it, so a long episode (a tau3 conversation, an asynchronous rollout) keeps the weights it
  started with. The new name is written to the :class:`AdapterLedger` only after every engine has
  loaded it whole, so a rollout never picks a half-loaded version; then versions older than the
  staleness budget are unloaded (an unload returns once no request holds the version: SGLang 0.5.15
  and the local engine both wait).

A checksum of the adapter folder (:func:`adapter_checksum`) guards the files between writer and
engine: the caller's copy is checked before any engine is asked to load it, and an engine that
verifies (the local engine; ``engine_verifies=True``) checks the files it reads against it too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aclarena_slime.sglang_client import SGLangClient, SGLangError

log = logging.getLogger(__name__)

VERSION_SEPARATOR = "@"
TRIAL_SUFFIX = ".incoming"  # the name a plain adapter's new folder is tried under before the old one goes
# SGLang 0.5.15's refusal at --max-loaded-loras (srt/managers/tokenizer_manager.py, load_lora_adapter)
_NO_ROOM = "Maximum number of loaded LoRA adapters is"
LEDGER_FILE = "versions.json"
_VERSIONED = re.compile(r"^(?P<name>.+)@(?P<version>\d+)$")


class AdapterSwapError(RuntimeError):
    """An engine refused the adapter, or its files do not match their checksum; the message says which."""


def versioned_name(name: str, version: int) -> str:
    """``search@12``: the name engines serve version ``version`` of adapter ``name`` under."""
    if version < 0:
        raise ValueError(f"an adapter version is a non-negative integer, got {version}")
    return f"{name}{VERSION_SEPARATOR}{version}"


def split_version(served: str) -> tuple[str, int | None]:
    """``search@12`` -> ``("search", 12)``; a plain name -> ``(name, None)``."""
    match = _VERSIONED.match(served)
    if match is None:
        return served, None
    return match["name"], int(match["version"])


def adapter_checksum(path: str | os.PathLike[str]) -> str:
    """SHA-256 over a PEFT folder's files (relative name and bytes, in name order); hidden files skipped."""
    root = Path(path)
    if not root.is_dir():
        raise AdapterSwapError(f"{root} is not an adapter folder")
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    return _digest((str(f.relative_to(root)), _blocks(f)) for f in files)


def files_checksum(files: Mapping[str, bytes]) -> str:
    """The checksum :func:`adapter_checksum` gives a folder holding ``files`` (name -> bytes): the writer
    takes it from what it meant to write, the reader from what is on disk."""
    return _digest((name, [files[name]]) for name in sorted(files))


def _digest(files: Iterable[tuple[str, Iterable[bytes]]]) -> str:
    digest = hashlib.sha256()
    for name, blocks in files:
        digest.update(name.encode() + b"\0")
        for block in blocks:
            digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def _blocks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        yield from iter(lambda: handle.read(1 << 20), b"")


def verify_checksum(path: str | os.PathLike[str], expected: str) -> None:
    """Refuse an adapter folder whose files are not the ones the checksum was taken of."""
    actual = adapter_checksum(path)
    if actual != expected:
        raise AdapterSwapError(
            f"adapter files at {path} do not match their checksum ({actual[:12]} != {expected[:12]})"
        )


@dataclass(frozen=True)
class ServedVersion:
    """The version an episode is pinned to: the name it requests and the version number."""

    adapter: str
    version: int

    @property
    def served(self) -> str:
        return versioned_name(self.adapter, self.version)


class AdapterLedger:
    """``<sync_dir>/versions.json``: per adapter, the current version and those still resident.

    The syncer writes it (atomically: a reader sees the old file or the new one) after every engine
    loaded a version; rollouts read it at the start of each episode to pin the episode's version, and
    again at its end to record staleness. It lives beside the adapter folders, which every engine and
    rollout process already reads.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / LEDGER_FILE

    def read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as exc:
            raise AdapterSwapError(f"{self.path} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise AdapterSwapError(f"{self.path} must hold an object of adapters")
        return data

    def current(self, adapter: str) -> ServedVersion | None:
        entry = self.read().get(adapter)
        return None if entry is None else ServedVersion(adapter, int(entry["current"]))

    def record(self, adapter: str, version: int, resident: Sequence[int], checksum: str | None) -> None:
        data = self.read()
        data[adapter] = {"current": version, "resident": sorted(resident), "checksum": checksum}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{LEDGER_FILE}.", dir=self.path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    def resident(self, adapter: str) -> list[int]:
        return list(self.read().get(adapter, {}).get("resident", []))


@dataclass(frozen=True)
class SwapResult:
    """What one swap did: the name now served, and the versions it unloaded."""

    served: str
    unloaded: tuple[str, ...] = ()


async def swap_adapter(
    clients: Sequence[SGLangClient],
    name: str,
    path: str | os.PathLike[str] | None = None,
    *,
    version: int | None = None,
    staleness_budget: int = 0,
    ledger: AdapterLedger | None = None,
    checksum: str | None = None,
    engine_verifies: bool = False,
    loaded: bool = True,
    pinned: bool = False,
    pause_mode: str | None = None,
    load: tuple[str, Sequence[dict[str, Any]]] | None = None,
    retiring: Callable[[str], None] | None = None,
) -> SwapResult:
    """Serve the adapter at ``path`` as ``name`` (plain) or ``name@version`` on every engine.

    ``loaded``: (plain names) a version is served now and must be unloaded first. ``pause_mode``:
    (plain names) wrap the unload and load in ``/pause_generation`` with that mode. ``staleness_budget``
    (versioned): how many syncs an episode's version may fall behind; versions older than that are
    unloaded. ``load``: an endpoint and one body per engine instead of ``/load_lora_adapter`` from
    ``path`` (the tensors sync). ``checksum`` is checked against ``path`` here before any load.
    ``retiring`` (versioned) is called with each retired name once the ledger has moved past it and before
    any engine unloads it (SGLang reloads an unloaded adapter from its folder when a request names it).
    """
    if (path is None) == (load is None):
        raise ValueError("swap_adapter takes a folder path or a (endpoint, bodies) load, exactly one")
    if version is not None and ledger is None:
        raise ValueError("a versioned swap needs the ledger the rollouts read")
    if staleness_budget < 0:
        raise ValueError(f"staleness_budget must be >= 0, got {staleness_budget}")
    if checksum is not None and path is not None:
        verify_checksum(path, checksum)
    served = name if version is None else versioned_name(name, version)
    if load is None:
        body: dict[str, Any] = {"lora_name": served, "lora_path": str(path), "pinned": pinned}
        if checksum is not None and engine_verifies:
            body["checksum"] = checksum
        load = ("/load_lora_adapter", [body] * len(clients))
    endpoint, bodies = load
    if len(bodies) != len(clients):
        raise ValueError(f"{len(bodies)} load bodies for {len(clients)} engines")
    bodies = [{**b, "lora_name": served} for b in bodies]
    if version is None:
        if loaded and path is not None:  # the folder proves itself before the version it replaces goes
            await asyncio.gather(*(_try_load(c, served, b) for c, b in zip(clients, bodies, strict=True)))
        steps = [_replace(c, served, endpoint, b, loaded, pause_mode) for c, b in zip(clients, bodies, strict=True)]
        await asyncio.gather(*steps)
        return SwapResult(served)
    assert ledger is not None
    await asyncio.gather(*(_post(c, endpoint, b) for c, b in zip(clients, bodies, strict=True)))
    previous = ledger.resident(name)
    keep = [v for v in previous if version - staleness_budget <= v < version] + [version]
    ledger.record(name, version, keep, checksum)  # from here on, new episodes start on this version
    retired = [versioned_name(name, v) for v in previous if v not in keep]
    if retiring is not None:
        for old in retired:
            retiring(old)
    await asyncio.gather(*(_unload(c, old) for c in clients for old in retired))
    return SwapResult(served, tuple(retired))


async def load_adapters(clients: Sequence[SGLangClient], adapters: dict[str, str]) -> list[str]:
    """Load each ``name -> folder`` on every engine unless it already serves it (a restarted router
    finds engines still loaded); returns the names loaded."""
    done = []
    for name, path in adapters.items():
        await asyncio.gather(*(_load_once(c, name, path) for c in clients))
        done.append(name)
    return done


async def _load_once(client: SGLangClient, name: str, path: str) -> None:
    try:
        await _post(client, "/load_lora_adapter", {"lora_name": name, "lora_path": path, "pinned": False})
    except AdapterSwapError as exc:
        if "already loaded" not in str(exc):
            raise


async def _try_load(client: SGLangClient, name: str, body: dict[str, Any]) -> None:
    """Load the new folder under a temporary name and unload it again: an engine that refuses it (a
    truncated safetensors, a bad config) does so while ``name`` still serves the old version."""
    trial = f"{name}{TRIAL_SUFFIX}"
    await _unload(client, trial)  # left by a swap killed between the two
    try:
        await _post(client, "/load_lora_adapter", {**body, "lora_name": trial, "pinned": False})
    except AdapterSwapError as exc:
        if _NO_ROOM in str(exc):  # --max-loaded-loras leaves no room for a second copy: swap untried, as before
            log.warning("no room on %s to try %r before the swap (%s); swapping untried", client.base_url, name, exc)
            return
        raise AdapterSwapError(f"{exc} (adapter {name!r} not replaced: the engine still serves its old version)") from exc
    await _unload(client, trial)


async def _replace(
    client: SGLangClient, name: str, endpoint: str, body: dict[str, Any], loaded: bool, pause_mode: str | None
) -> None:
    if pause_mode is not None:
        await _post(client, "/pause_generation", {"mode": pause_mode})
    try:
        if loaded:
            await _unload(client, name)
        await _post(client, endpoint, body)
    finally:
        if pause_mode is not None:
            await _post(client, "/continue_generation", {})


async def _unload(client: SGLangClient, name: str) -> None:
    """Unload ``name``; an engine that does not hold it (first sync, restarted server) is fine."""
    try:
        await _post(client, "/unload_lora_adapter", {"lora_name": name})
    except AdapterSwapError as exc:
        log.info("unload of %r on %s skipped: %s", name, client.base_url, exc)


async def _post(client: SGLangClient, path: str, body: dict[str, Any]) -> Any:
    """POST; an HTTP error or SGLang's ``success: false`` becomes :class:`AdapterSwapError`."""
    try:
        answer = await client.post(path, body)
    except SGLangError as exc:
        raise AdapterSwapError(str(exc)) from exc
    if isinstance(answer, dict) and answer.get("success") is False:
        raise AdapterSwapError(f"{client.base_url}{path} refused: {answer}")
    return answer
