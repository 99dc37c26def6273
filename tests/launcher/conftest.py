"""Shared fixtures of the launcher tests."""

from __future__ import annotations

import pytest

from aclarena_slime.recipes import addresses

ROUTABLE_IP = "10.9.8.7"


@pytest.fixture
def routable(monkeypatch) -> str:
    """This machine's default-route address, as the recipe loader sees it (a real one may not exist in CI)."""
    monkeypatch.setattr(addresses, "routable_ip", lambda: ROUTABLE_IP)
    return ROUTABLE_IP
