"""Shared pieces for the router tests: an expert manifest on disk and a gateway in front of fake engines."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from aclarena_slime.experts import ExpertTable
from aclarena_slime.router import EnginePool, ExpertResolver, TagClassifier, build_app
from aclarena_slime.router.gateway import GatewaySettings

TAGS = ("math", "search", "retail", "ifeval")


def write_manifest(root: Path, experts: dict | None = None, default: str | None = None) -> Path:
    """An ``experts.json`` with one PEFT-looking adapter directory per tag, as the curriculum writes it."""
    if experts is None:
        experts = {}
        for tag in TAGS:
            (root / "experts" / tag).mkdir(parents=True, exist_ok=True)
            (root / "experts" / tag / "adapter_config.json").write_text('{"r": 16}')
            experts[tag] = {"adapter": f"{tag}-expert", "path": f"experts/{tag}", "stage": f"stage_{tag}"}
    manifest = root / "experts.json"
    data = {"version": 1, "base": {"name": "qwen3-8b-sdft", "path": "backbone"}, "experts": experts, "default": default}
    manifest.write_text(json.dumps(data))
    return manifest


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return write_manifest(tmp_path)


@contextlib.asynccontextmanager
async def gateway(
    engine_urls: list[str],
    manifest: Path,
    *,
    api_key: str | None = None,
    classifier: TagClassifier | None = None,
    health_interval_s: float = 0.05,
    settings: GatewaySettings | None = None,
) -> AsyncIterator[tuple[str, EnginePool]]:
    table = ExpertTable.load(manifest)
    pool = EnginePool(engine_urls, table, health_interval_s=health_interval_s, health_timeout_s=1.0)
    app = build_app(pool, ExpertResolver(table, classifier), api_key=api_key, settings=settings)
    async with app.serving() as url:
        yield url, pool


@contextlib.asynccontextmanager
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(session: aiohttp.ClientSession, url: str, payload: dict, **headers: str) -> tuple[int, dict]:
    async with session.post(url, json=payload, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)
